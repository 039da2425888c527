"""The native decode step's cost by rows: one sequence's draft being verified, and batches.

    flock /tmp/bench.lock .venv/bin/python bench/native_step.py             # rewrites its section
    flock /tmp/bench.lock .venv/bin/python bench/native_step.py --no-write  # print only

SmolLM2-135M-Instruct with the serving default weights (int8 on a CPU), the step called
directly (`NativeDecoder.step`) on random tokens at a given context length, with the
engine's threads. Rows of one sequence sit at successive positions and attend to each
other causally, as a speculative draft does; a batch is that many sequences of the same
length. The baseline is the same step for one row, measured in the same run, interleaved
with the others: its ratios are what engine/spec_drafts.py weighs a draft's length by.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from doc_section import write_section

from engine import EngineConfig, PagedEngine, default_model_source
from engine.native_decode import NativeDecoder

DRAFT_ROWS = (1, 2, 3, 4, 5, 6, 7, 8)
BATCHES = (16, 32)


def step_inputs(rows: int, context: int, one_sequence: bool) -> tuple[torch.Tensor, ...]:
    """Token ids, positions and context slots of `rows` rows after `context` tokens."""
    ids = torch.randint(0, 1000, (rows,), generator=torch.Generator().manual_seed(rows))
    if one_sequence:
        positions = torch.arange(context, context + rows)
        slots = torch.arange(context + rows).repeat(rows, 1)
    else:
        positions = torch.full((rows,), context)
        width = context + 1
        slots = torch.stack([torch.arange(width) + row * width for row in range(rows)])
    return ids, positions, slots


def median_ms(
    native: NativeDecoder, inputs: tuple[torch.Tensor, ...], threads: int, reps: int
) -> float:
    ids, positions, slots = inputs
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        native.step(ids, positions, slots, threads)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def measure(context: int, reps: int) -> tuple[dict[str, float], float, int]:
    """Median ms by scenario name, the one-row baseline's median, and the threads."""
    # 32 sequences of 600 tokens: the default pool holds them in bf16, not in float32.
    config = EngineConfig(weights="auto", kv_cache_mb=1024)
    engine = PagedEngine.load(default_model_source(), "cpu", config=config)
    try:
        runner = engine.call(lambda core: core.runner)
        native, threads = runner.native, runner.threads
        if native is None:
            raise SystemExit("the native decode step is not available on this machine")
        scenarios = {
            f"{rows} row{'s' if rows > 1 else ''} of one sequence": (rows, True)
            for rows in DRAFT_ROWS
        }
        scenarios |= {f"{rows} sequences": (rows, False) for rows in BATCHES}
        needed = max(context + max(DRAFT_ROWS), max(BATCHES) * (context + 1))
        if needed > runner.pool.num_slots:
            raise SystemExit(f"the KV pool holds {runner.pool.num_slots} slots, {needed} needed")
        inputs = {name: step_inputs(rows, context, one) for name, (rows, one) in scenarios.items()}
        baseline = step_inputs(1, context, True)
        for each in (*inputs.values(), baseline):
            median_ms(native, each, threads, 3)  # warm
        results: dict[str, list[float]] = {name: [] for name in scenarios}
        base: list[float] = []
        # Rounds of every scenario, each beside a fresh baseline, so that the machine's
        # drift falls on both.
        for _ in range(3):
            for name, each in inputs.items():
                base.append(median_ms(native, baseline, threads, reps))
                results[name].append(median_ms(native, each, threads, reps))
        return (
            {name: statistics.median(v) for name, v in results.items()},
            statistics.median(base),
            threads,
        )
    finally:
        engine.close()


def render(figures: dict[str, float], base: float, threads: int, context: int) -> str:
    lines = [
        "## The native decode step by rows",
        "",
        f"Command: `flock /tmp/bench.lock .venv/bin/python bench/native_step.py` "
        f"({time.strftime('%Y-%m-%d', time.gmtime())}, {threads} threads). SmolLM2-135M-"
        f"Instruct, int8 weights, the step alone on random tokens after {context} tokens of "
        "context; median ms of 3 rounds, each beside a baseline of one row measured in turn "
        f"with it (its median: {base:.2f} ms).",
        "",
        "| step | ms | against one row |",
        "| --- | ---: | ---: |",
    ]
    for name, ms in figures.items():
        lines.append(f"| {name} | {ms:.2f} | {ms / base:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=600, help="tokens before the step")
    parser.add_argument("--reps", type=int, default=20, help="steps timed per median")
    parser.add_argument("--no-write", action="store_true", help="do not touch the docs")
    args = parser.parse_args()
    figures, base, threads = measure(args.context, args.reps)
    text = render(figures, base, threads, args.context)
    print(text)
    if not args.no_write:
        write_section("native_step", text)


if __name__ == "__main__":
    main()

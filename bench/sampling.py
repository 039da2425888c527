"""Token choice over a whole vocabulary: the engine's sampler against the plain one, in one run.

    flock /tmp/bench.lock .venv/bin/python bench/sampling.py             # rewrites its section
    flock /tmp/bench.lock .venv/bin/python bench/sampling.py --no-write  # print only

Rows of logits the size of SmolLM2's vocabulary (49,152 tokens; random, with 50 likely
tokens, so that the nucleus of top_p 0.9 lies among a few hundred, as it does in SmolLM2's
own distributions) go through `engine.sampling.sample_batch` and through the plain sampler
it replaced, reimplemented here as the baseline: a softmax of the scaled rows, a sort of the
whole vocabulary for top-p, and an argmax over every row. Both draw with `draw_rows`. The two
take turns; median ms a call, on the engine's threads (all cores).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from doc_section import write_section

from engine.sampling import (
    apply_logit_bias,
    apply_penalties,
    draw,
    draw_rows,
    sample_batch,
    token_logprob,
)
from engine.types import SamplingParams, TokenLogprob

VOCABULARY = 49_152
ROWS = (1, 16, 64)
KINDS = {
    "greedy": SamplingParams(temperature=0),
    "temperature 0.7": SamplingParams(temperature=0.7),
    "temperature 0.7, top_p 0.9": SamplingParams(temperature=0.7, top_p=0.9),
}
CALLS = 30

Sampler = Callable[
    [torch.Tensor, Sequence[SamplingParams], Sequence[torch.Generator | None]], list[int]
]


def _plain_scaled(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    divisors = temperatures.clamp_min(torch.finfo(torch.float32).tiny)[:, None]
    rows = logits.float()
    return (rows - rows.amax(dim=-1, keepdim=True)) / divisors


def _plain_probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    probs = torch.softmax(_plain_scaled(logits[None], torch.tensor([params.temperature]))[0], -1)
    if params.top_p < 1.0:
        sorted_probs, sorted_ids = torch.sort(probs, descending=True)
        outside = torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= params.top_p
        probs = probs.index_fill(0, sorted_ids[outside], 0.0)
        probs /= probs.sum()
    return probs


def plain_sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> list[int]:
    """The baseline: `sample_batch` as it was, its per-row steps included."""
    outputs: list[list[int]] = [[] for _ in params]
    for row, (p, out) in enumerate(zip(params, outputs, strict=True)):
        if p.has_penalties:
            apply_penalties(logits[row], out, p)
        apply_logit_bias(logits[row], p)
    tokens: list[int] = logits.argmax(dim=-1).tolist()
    plain: list[int] = []
    for row, p in enumerate(params):
        if p.is_greedy:
            continue
        if p.top_k == 0 and p.top_p >= 1:
            plain.append(row)
        else:
            tokens[row] = draw(_plain_probabilities(logits[row], p), generators[row])
    if plain:
        temperatures = torch.tensor([params[r].temperature for r in plain])
        probs = torch.softmax(_plain_scaled(logits[plain], temperatures), dim=-1)
        for row, token in zip(plain, draw_rows(probs, [generators[r] for r in plain]), strict=True):
            tokens[row] = token
    results: list[tuple[int, TokenLogprob | None]] = []
    for row, p in enumerate(params):
        token = tokens[row]
        logprob = token_logprob(logits[row], token, p.top_logprobs) if p.logprobs else None
        results.append((token, logprob))
    return [token for token, _ in results]


def engine_sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> list[int]:
    outputs: list[list[int]] = [[] for _ in params]
    return [token for token, _ in sample_batch(logits, params, outputs, generators)]


def logits_like_a_model(rows: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, VOCABULARY, generator=generator) * 3
    logits[:, :50] += 12
    return logits


def time_call(sampler: Sampler, logits: torch.Tensor, params: list[SamplingParams]) -> float:
    generators = [torch.Generator().manual_seed(row) for row in range(len(params))]
    copy = logits.clone()  # the sampler may change its logits in place
    started = time.perf_counter()
    sampler(copy, params, generators)
    return (time.perf_counter() - started) * 1000


def measure() -> list[tuple[str, int, float, float]]:
    """(kind, rows, baseline ms, engine ms) medians, the two samplers in turn."""
    results = []
    for kind, params in KINDS.items():
        for rows in ROWS:
            logits = logits_like_a_model(rows, seed=rows)
            batch = [params] * rows
            for sampler in (plain_sample, engine_sample):  # warm-up
                time_call(sampler, logits, batch)
            plain: list[float] = []
            ours: list[float] = []
            for call in range(CALLS):
                order = (plain_sample, engine_sample) if call % 2 else (engine_sample, plain_sample)
                for sampler in order:
                    (plain if sampler is plain_sample else ours).append(
                        time_call(sampler, logits, batch)
                    )
            results.append((kind, rows, statistics.median(plain), statistics.median(ours)))
            print(kind, rows, f"{results[-1][2]:.2f} -> {results[-1][3]:.2f} ms", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true", help="do not touch the docs")
    args = parser.parse_args()
    results = measure()
    lines = [
        "## Sampling a token",
        "",
        "Command: `flock /tmp/bench.lock .venv/bin/python bench/sampling.py` "
        f"({time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, {torch.get_num_threads()} torch threads). Rows of "
        f"{VOCABULARY:,} logits with 50 likely tokens; `engine.sampling.sample_batch` "
        "against the plain sampler it replaced (a softmax of the scaled rows, a sort of the "
        "whole vocabulary for top-p, an argmax over every row), in turn, median ms of "
        f"{CALLS} calls.",
        "",
        "| rows sampled | rows | plain, ms | engine, ms | ratio |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for kind, rows, plain, ours in results:
        lines.append(f"| {kind} | {rows} | {plain:.2f} | {ours:.2f} | {plain / ours:.2f}x |")
    section = "\n".join(lines)
    print(section)
    if not args.no_write:
        write_section("sampling", section)


if __name__ == "__main__":
    main()

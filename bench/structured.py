"""Constrained decoding in the paged engine, against free text, in one run.

    .venv/bin/python bench/structured.py            # full run, rewrites docs/benchmarks.md
    .venv/bin/python bench/structured.py --quick    # fewer runs, for a smoke test
    .venv/bin/python bench/structured.py --no-write # print only

The serving configuration (`weights="auto"`: int8 weights, decode steps native on a CPU
with a compiler). Three measures:
- decode speed with a JSON schema against free text, the same chat prompts, greedy, at 1
  and 16 streams: the schemas' answers are arrays of objects with `minItems`, longer than
  `max_tokens`, and the free text ignores EOS, so both sides generate exactly `max_tokens`;
  in pairs run one after the other, the order swapped every other pair;
- the masks' cost per step (engine/grammar.py's `fill_masks` and `apply_masks`, and each
  matcher's `accept`) replayed over the answers the engine gave, at the same batch sizes,
  next to the decode step time (the median gap between a stream's tokens);
- compile time of the schemas (those of bench/grammar_backends.py and the two here), cold
  (a fresh `Grammars`) and cached (its LRU), and the matcher each request gets.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from doc_section import write_section
from grammar_backends import SCHEMAS, percentile, us

from engine import (
    ChatMessage,
    Constraint,
    EngineConfig,
    PagedEngine,
    SamplingParams,
    default_model_source,
    resolve_engine_config,
)
from engine.grammar import GrammarRows, Grammars, apply_masks, fill_masks
from engine.model_source import load_pretrained
from engine.tokenization import encode_chat

CITIES = {
    "type": "object",
    "properties": {
        "cities": {
            "type": "array",
            "minItems": 24,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 24},
                    "country": {"type": "string", "maxLength": 24},
                    "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
                },
                "required": ["name", "country", "population"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["cities"],
    "additionalProperties": False,
}
INVENTORY = {
    "type": "array",
    "minItems": 16,
    "items": {
        "type": "object",
        "properties": {
            "sku": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
            "item": {"type": "string", "maxLength": 32},
            "quantity": {"type": "integer", "minimum": 0, "maximum": 999},
            "in_stock": {"type": "boolean"},
        },
        "required": ["sku", "item", "quantity", "in_stock"],
        "additionalProperties": False,
    },
}
REGIONS = (
    "Europe",
    "Asia",
    "Africa",
    "South America",
    "North America",
    "the Middle East",
    "Scandinavia",
    "Oceania",
)
SHOPS = (
    "a hardware store",
    "a bakery",
    "a bookshop",
    "a pharmacy",
    "a toy shop",
    "a garden centre",
    "a music store",
    "a sports shop",
)
# Each scenario runs this many times, schema and free text in turn, and the tables quote
# the median: on these shared cores one disturbed run moved a stream from 37 to 8 tok/s.
RUNS_ONE_STREAM = 5
RUNS_16_STREAMS = 3


@dataclass(frozen=True)
class Workload:
    """A chat prompt and the schema its answer follows when constrained."""

    prompt: list[int]
    schema: dict[str, Any]

    @property
    def constraint(self) -> Constraint:
        return Constraint("json_schema", json.dumps(self.schema))


@dataclass(frozen=True)
class StreamRun:
    """One stream's tokens and when each arrived (seconds since the run began)."""

    tokens: list[int]
    arrivals: list[float]


@dataclass(frozen=True)
class Run:
    """One batch of streams: wall time, and the CPU time of the whole process (every
    thread: the engine's, its native workers', the mask thread)."""

    streams: list[StreamRun]
    seconds: float
    cpu_seconds: float

    @property
    def tokens(self) -> int:
        return sum(len(s.tokens) for s in self.streams)

    @property
    def total_rate(self) -> float:
        return self.tokens / self.seconds

    @property
    def cpu_per_token(self) -> float:
        return self.cpu_seconds / self.tokens

    @property
    def decode_rate(self) -> float:
        """Tokens after the first per second after the first, summed over the streams."""
        return sum((len(s.tokens) - 1) / (s.arrivals[-1] - s.arrivals[0]) for s in self.streams)

    @property
    def step_seconds(self) -> float:
        """The median gap between a stream's tokens: one decode step per token."""
        return statistics.median(
            b - a for s in self.streams for a, b in zip(s.arrivals, s.arrivals[1:], strict=False)
        )


def workloads(tokenizer: Any, count: int) -> list[Workload]:
    """City lists and shop inventories in turn, each asked of a different place."""
    made = []
    for i in range(count):
        if i % 2 == 0:
            question = f"List twenty-four cities of {REGIONS[i // 2 % 8]} as JSON, with their "
            question += "country and population."
            schema = CITIES
        else:
            question = f"Write the inventory of {SHOPS[i // 2 % 8]} as a JSON array of items "
            question += "with a SKU, a name, a quantity and whether it is in stock."
            schema = INVENTORY
        made.append(Workload(encode_chat(tokenizer, [ChatMessage("user", question)]), schema))
    return made


async def timed_run(
    engine: PagedEngine, jobs: list[Workload], max_tokens: int, constrained: bool
) -> Run:
    """Submit every job at once; greedy, constrained to its schema or free text to
    `max_tokens` (EOS ignored, so that it runs as long as a schema answer)."""
    started = time.perf_counter()
    cpu_started = time.process_time()

    async def one(job: Workload) -> StreamRun:
        grammar = None
        if constrained:
            params = SamplingParams(max_tokens=max_tokens, constraint=job.constraint)
            grammar = await engine.compile_constraint(job.constraint)
        else:
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        tokens: list[int] = []
        arrivals: list[float] = []
        async for out in engine.stream_tokens(job.prompt, params, grammar=grammar):
            if out.token_id is not None:
                tokens.append(out.token_id)
                arrivals.append(time.perf_counter() - started)
        return StreamRun(tokens, arrivals)

    streams = list(await asyncio.gather(*(one(job) for job in jobs)))
    return Run(streams, time.perf_counter() - started, time.process_time() - cpu_started)


@dataclass(frozen=True)
class MaskCost:
    """Seconds per step of the engine's mask functions, replayed over real answers."""

    fill: list[float]
    apply: list[float]
    accept: list[float]  # per token


def replay_masks(engine: PagedEngine, jobs: list[Workload], answers: list[list[int]]) -> MaskCost:
    """Step through the answers as the engine did: each step fills the masks of every stream
    still running, applies them to that many logit rows, and accepts each stream's token."""
    grammars = engine.grammars
    states = [grammars.state(grammars.compile(job.constraint)) for job in jobs]
    vocab = grammars.vocab_size
    logits = torch.randn(len(jobs), vocab)
    fill: list[float] = []
    apply: list[float] = []
    accept: list[float] = []
    for step in range(max(len(a) for a in answers)):
        live = [i for i, answer in enumerate(answers) if step < len(answer)]
        constrained = [GrammarRows(row, states[i]) for row, i in enumerate(live)]
        rows = list(range(len(live)))
        started = time.perf_counter()
        masks = fill_masks(len(live), constrained)
        fill.append(time.perf_counter() - started)
        step_logits = logits[: len(live)]
        started = time.perf_counter()
        apply_masks(step_logits, masks, rows)
        apply.append(time.perf_counter() - started)
        for i in live:
            started = time.perf_counter()
            if not states[i].accept(answers[i][step]):
                raise SystemExit(f"the replay refused token {step} of stream {i}")
            accept.append(time.perf_counter() - started)
    return MaskCost(fill, apply, accept)


@dataclass(frozen=True)
class CompileTimes:
    name: str
    cold: list[float]
    cached: list[float]
    matcher: list[float]


def compile_times(engine: PagedEngine, tokenizer: Any, repeats: int) -> list[CompileTimes]:
    """Each schema compiled once in each of `repeats` fresh `Grammars` (cold), then taken
    from its LRU (cached), and the matcher a request gets from it."""
    cases = [(case.name, case.source) for case in SCHEMAS]
    cases += [("cities (this bench)", json.dumps(CITIES))]
    cases += [("inventory (this bench)", json.dumps(INVENTORY))]
    base = engine.grammars
    times = {name: CompileTimes(name, [], [], []) for name, _ in cases}
    for _ in range(repeats):
        grammars = Grammars(tokenizer, base.vocab_size, base.stop_token_ids)
        for name, source in cases:
            constraint = Constraint("json_schema", source)
            started = time.perf_counter()
            grammars.compile(constraint)
            times[name].cold.append(time.perf_counter() - started)
            started = time.perf_counter()
            compiled = grammars.compile(constraint)
            times[name].cached.append(time.perf_counter() - started)
            started = time.perf_counter()
            grammars.state(compiled)
            times[name].matcher.append(time.perf_counter() - started)
    return list(times.values())


@dataclass(frozen=True)
class Scenario:
    """Schema and free-text runs of one batch size, and the masks' cost at that size."""

    streams: int
    schema: list[Run]
    free: list[Run]
    masks: MaskCost
    rate: str  # the Run property compared: "decode_rate" or "total_rate"

    def rates(self, runs: list[Run]) -> float:
        return float(statistics.median(getattr(r, self.rate) for r in runs))

    def ratios(self) -> list[float]:
        """Schema over free text, pair by pair (each pair ran one after the other)."""
        return [
            getattr(s, self.rate) / getattr(f, self.rate)
            for s, f in zip(self.schema, self.free, strict=True)
        ]


def scenario(
    engine: PagedEngine, jobs: list[Workload], max_tokens: int, runs: int, rate: str
) -> Scenario:
    """`runs` pairs of a free-text and a schema run, the order swapped every other pair so
    that load rising or falling on the shared cores favours neither side."""
    schema: list[Run] = []
    free: list[Run] = []
    for pair in range(runs):
        for constrained in (False, True) if pair % 2 == 0 else (True, False):
            run = asyncio.run(timed_run(engine, jobs, max_tokens, constrained))
            (schema if constrained else free).append(run)
        short = [len(s.tokens) for s in schema[-1].streams if len(s.tokens) < max_tokens]
        if short:
            raise SystemExit(f"schema answers ended before {max_tokens} tokens: {short}")
        print(
            f"{len(jobs)} stream(s): schema {getattr(schema[-1], rate):.1f} tok/s, "
            f"free text {getattr(free[-1], rate):.1f} tok/s",
            flush=True,
        )
    answers = [s.tokens for s in schema[-1].streams]
    return Scenario(len(jobs), schema, free, replay_masks(engine, jobs, answers), rate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs (smoke test)")
    parser.add_argument("--no-write", action="store_true", help="do not touch the docs")
    args = parser.parse_args()
    max_tokens = 64 if args.quick else 128
    load_before = os.getloadavg()[0]
    begun = time.perf_counter()

    source = default_model_source()
    hf, tokenizer = load_pretrained(source, torch.float32)
    config = EngineConfig(weights="auto")
    weights = resolve_engine_config(config, "cpu").weights
    engine = PagedEngine.from_hf_model(hf, tokenizer, source.model_id, "cpu", config=config)
    jobs = workloads(tokenizer, 16)
    compiles = compile_times(engine, tokenizer, 2 if args.quick else 5)
    print("compiled:", [f"{c.name} {statistics.median(c.cold) * 1e3:.1f} ms" for c in compiles])
    asyncio.run(timed_run(engine, jobs[:2], 8, constrained=False))
    asyncio.run(timed_run(engine, jobs[:2], 8, constrained=True))
    print(f"warmed up ({weights} weights)", flush=True)

    scenarios = [
        scenario(engine, jobs[:1], max_tokens, 1 if args.quick else RUNS_ONE_STREAM, "decode_rate"),
        scenario(engine, jobs, max_tokens, 1 if args.quick else RUNS_16_STREAMS, "total_rate"),
    ]
    engine.close()
    elapsed = time.perf_counter() - begun
    section = render(scenarios, compiles, weights, max_tokens, load_before, elapsed, args.quick)
    print(section)
    if not args.no_write:
        write_section("structured", section.rstrip("\n"))
        print("wrote the structured section of docs/benchmarks.md")


def compared_ms(label: str, s: Scenario, pick: Callable[[Run], float]) -> str:
    """A table row: the median of `pick` (seconds) over the schema and free-text runs."""
    schema = statistics.median(pick(r) for r in s.schema)
    free = statistics.median(pick(r) for r in s.free)
    return f"| {label} | {schema * 1e3:.2f} | {free * 1e3:.2f} | {schema / free:.2f}x | - |"


def spread(values: list[float]) -> str:
    """p50 / p99 in microseconds."""
    return f"{us(statistics.median(values))} / {us(percentile(values, 0.99))}"


def render(
    scenarios: list[Scenario],
    compiles: list[CompileTimes],
    weights: str,
    max_tokens: int,
    load: float,
    elapsed: float,
    quick: bool,
) -> str:
    command = ".venv/bin/python bench/structured.py" + (" --quick" if quick else "")
    lines = [
        "### Constrained decoding in the engine",
        "",
        f"Command: `{command}` ({elapsed / 60:.1f} min). {os.cpu_count()} cores, load "
        f"average {load:.1f} when the run started; the serving configuration "
        f'(`weights="auto"`: {weights}), greedy. Schema answers (city lists, '
        f"`minItems` 24, and shop inventories, `minItems` 16, in turn) and free text (the "
        f"same chat prompts, EOS ignored) each generate exactly {max_tokens} tokens; the "
        "figures are the median of "
        + " and ".join(f"{len(s.schema)} runs at {s.streams}" for s in scenarios)
        + " stream(s), run in pairs, schema and free text one after the other, the order "
        "swapped every other pair; the ratio is the median of the pairs' ratios (each pair's "
        "in brackets). "
        "1 stream: decode tok/s (first token left out); 16 streams: generated tok/s over "
        "the wall time. CPU per token: the whole process's CPU time (engine thread, native "
        "workers, mask thread) over the tokens; the native workers spin at their barriers, "
        "so it moves with the load on the cores too.",
        "",
        "| Scenario | With a schema | Free text | Ratio | Goal |",
        "|---|---|---|---|---|",
    ]
    for s in scenarios:
        label = "1 stream: decode tok/s" if s.streams == 1 else f"{s.streams} streams: total tok/s"
        ratios = s.ratios()
        runs = " / ".join(f"{r:.2f}" for r in ratios)
        lines.append(
            f"| {label} | {s.rates(s.schema):.1f} | {s.rates(s.free):.1f} "
            f"| {statistics.median(ratios):.2f}x (pairs {runs}) | >= 0.9x |"
        )
    for s in scenarios:
        label = f"{s.streams} stream(s): decode step, ms (median gap between a stream's tokens)"
        lines.append(compared_ms(label, s, lambda r: r.step_seconds))
    for s in scenarios:
        label = f"{s.streams} stream(s): process CPU ms per token"
        lines.append(compared_ms(label, s, lambda r: r.cpu_per_token))
    lines += [
        "",
        "The masks' cost, replayed over the schema runs' answers with the engine's own "
        "functions at the same batch sizes: `fill_masks` (a step's masks, every "
        "constrained row's; the runner fills them on its mask thread while the model runs), "
        "`apply_masks` (on the step's logits, after the model) and each matcher's `accept` "
        "(on the engine thread, after sampling). p50 / p99 in microseconds; the shares are "
        "p50s over the free-text decode step: on the sampling path (apply and the accepts, "
        "which the step waits for) and in all (the fill too, which takes CPU from the model "
        "when every core is busy).",
        "",
        "| Streams | decode step, us (free text) | fill_masks per step | apply_masks per step "
        "| accept per token | sampling path, % of step | all mask work, % of step |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in scenarios:
        free_step = statistics.median(r.step_seconds for r in s.free)
        path = statistics.median(s.masks.apply) + s.streams * statistics.median(s.masks.accept)
        every = path + statistics.median(s.masks.fill)
        lines.append(
            f"| {s.streams} | {us(free_step)} | {spread(s.masks.fill)} "
            f"| {spread(s.masks.apply)} | {spread(s.masks.accept)} "
            f"| {100 * path / free_step:.2f} | {100 * every / free_step:.2f} |"
        )
    lines += [
        "",
        "Compile time (`Grammars.compile`, one compile thread): cold in a fresh `Grammars` "
        f"(median of {len(compiles[0].cold)}, and the slowest), cached from its LRU, and the "
        "matcher each request gets (`Grammars.state`).",
        "",
        "| Schema | cold, ms (median / max) | cached, us | matcher, us |",
        "|---|---|---|---|",
    ]
    for c in compiles:
        lines.append(
            f"| {c.name} | {statistics.median(c.cold) * 1e3:.1f} / {max(c.cold) * 1e3:.1f} "
            f"| {us(statistics.median(c.cached))} | {us(statistics.median(c.matcher))} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

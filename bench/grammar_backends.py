"""xgrammar against llguidance on SmolLM2's 49,152-token vocabulary, in one run.

    .venv/bin/python bench/grammar_backends.py            # full run, rewrites docs/benchmarks.md
    .venv/bin/python bench/grammar_backends.py --quick    # fewer repeats, for a smoke test
    .venv/bin/python bench/grammar_backends.py --no-write # print only

For each schema, with both libraries set up the engine's way (compact JSON, no free
whitespace, SmolLM2's stop tokens): the compile time, from the schema's text to a matcher
ready for its first mask, cold (nothing cached) and cached (from what a cache would keep:
xgrammar's compiled grammar, a pristine llguidance matcher to copy); and the time to fill
one token's mask while a valid compact answer is replayed token by token, each token
checked to be allowed by the mask and then accepted, the stop token last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import jsonschema
import llguidance
import llguidance.hf
import llguidance.torch
import torch
import xgrammar as xgr
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from doc_section import write_section

from engine.model_source import default_model_source
from engine.tokenization import find_stop_token_ids

VOCAB_SIZE = 49152
# JSON as the engine writes it (engine/grammar.py): no whitespace between tokens.
COMPACT = (",", ":")


@dataclass(frozen=True)
class SchemaCase:
    """A schema and one valid answer to replay through the matchers."""

    name: str
    schema: dict[str, Any]
    instance: Any

    @property
    def source(self) -> str:
        return json.dumps(self.schema)

    @property
    def answer(self) -> str:
        """The answer as the engine writes it: compact, keys in the schema's order."""
        return json.dumps(self.instance, separators=COMPACT, ensure_ascii=False)


SCHEMAS: tuple[SchemaCase, ...] = (
    SchemaCase(
        "flat object",
        {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer"},
                "height_m": {"type": "number"},
                "member": {"type": "boolean"},
            },
            "required": ["name", "age", "height_m", "member"],
            "additionalProperties": False,
        },
        {"name": "Ada Lovelace", "age": 36, "height_m": 1.65, "member": True},
    ),
    SchemaCase(
        "nested object with arrays",
        {
            "type": "object",
            "properties": {
                "customer": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "address": {
                            "type": "object",
                            "properties": {
                                "street": {"type": "string"},
                                "city": {"type": "string"},
                                "zip": {"type": "string"},
                            },
                            "required": ["street", "city", "zip"],
                            "additionalProperties": False,
                        },
                    },
                    "required": ["name", "address"],
                    "additionalProperties": False,
                },
                "items": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 10,
                    "items": {
                        "type": "object",
                        "properties": {
                            "sku": {"type": "string"},
                            "quantity": {"type": "integer"},
                            "price": {"type": "number"},
                        },
                        "required": ["sku", "quantity", "price"],
                        "additionalProperties": False,
                    },
                },
                "notes": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["customer", "items", "notes"],
            "additionalProperties": False,
        },
        {
            "customer": {
                "name": "Grace Hopper",
                "address": {"street": "12 Harbour Road", "city": "Arlington", "zip": "22201"},
            },
            "items": [
                {"sku": "KB-101", "quantity": 2, "price": 49.5},
                {"sku": "MS-7", "quantity": 1, "price": 19.99},
            ],
            "notes": ["leave at the door", "fragile"],
        },
    ),
    SchemaCase(
        "enums and const",
        {
            "type": "object",
            "properties": {
                "kind": {"const": "ticket"},
                "status": {"enum": ["open", "pending", "resolved", "closed"]},
                "priority": {"enum": ["low", "medium", "high", "urgent"]},
                "team": {"enum": ["billing", "support", "sales", "security", "platform"]},
                "labels": {
                    "type": "array",
                    "items": {"enum": ["bug", "feature", "question", "duplicate", "wontfix"]},
                    "maxItems": 5,
                },
            },
            "required": ["kind", "status", "priority", "team", "labels"],
            "additionalProperties": False,
        },
        {
            "kind": "ticket",
            "status": "pending",
            "priority": "urgent",
            "team": "security",
            "labels": ["bug", "duplicate"],
        },
    ),
    SchemaCase(
        "anyOf and nullable",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "subtitle": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "rating": {"type": ["number", "null"]},
                "identifier": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                "source": {
                    "anyOf": [
                        {
                            "type": "object",
                            "properties": {"url": {"type": "string"}},
                            "required": ["url"],
                            "additionalProperties": False,
                        },
                        {"type": "null"},
                    ]
                },
            },
            "required": ["title", "subtitle", "rating", "identifier", "source"],
            "additionalProperties": False,
        },
        {
            "title": "The Analytical Engine",
            "subtitle": None,
            "rating": 4.5,
            "identifier": "isbn-0262",
            "source": {"url": "https://example.org/engine"},
        },
    ),
    SchemaCase(
        "patterns and numeric bounds",
        {
            "type": "object",
            "properties": {
                "order_id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                "email": {"type": "string", "pattern": "^[a-z0-9.]+@[a-z0-9]+\\.[a-z]{2,4}$"},
                "code": {"type": "string", "minLength": 4, "maxLength": 8},
                "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                "discount": {"type": "number", "minimum": 0, "maximum": 0.5},
                "score": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 1000},
            },
            "required": ["order_id", "email", "code", "quantity", "discount", "score"],
            "additionalProperties": False,
        },
        {
            "order_id": "ABC-1234",
            "email": "ada.lovelace@example.org",
            "code": "X7Q2Z",
            "quantity": 12,
            "discount": 0.25,
            "score": 873,
        },
    ),
    SchemaCase(
        "tool call",
        {
            "type": "object",
            "properties": {
                "name": {"const": "get_weather"},
                "arguments": {
                    "type": "object",
                    "properties": {
                        "location": {"type": "string"},
                        "unit": {"enum": ["celsius", "fahrenheit"]},
                        "days": {"type": "integer", "minimum": 1, "maximum": 14},
                        "include_hourly": {"type": "boolean"},
                    },
                    "required": ["location", "unit", "days", "include_hourly"],
                    "additionalProperties": False,
                },
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        },
        {
            "name": "get_weather",
            "arguments": {
                "location": "Lyon, France",
                "unit": "celsius",
                "days": 3,
                "include_hourly": False,
            },
        },
    ),
)


class Matcher(Protocol):
    def fill(self, bitmask: torch.Tensor) -> None: ...
    def accept(self, token_id: int) -> bool: ...
    def finished(self) -> bool: ...


class Backend(Protocol):
    """One library: compile a schema to what a cache would keep, and make matchers of it."""

    name: str

    def compile(self, schema: str) -> Any: ...
    def matcher(self, compiled: Any) -> Matcher: ...


class XGrammarMatcher:
    def __init__(self, matcher: xgr.GrammarMatcher) -> None:
        self._matcher = matcher

    def fill(self, bitmask: torch.Tensor) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, 0)

    def accept(self, token_id: int) -> bool:
        return bool(self._matcher.accept_token(token_id))

    def finished(self) -> bool:
        return bool(self._matcher.is_terminated())


class XGrammar:
    """xgrammar as engine/grammar.py uses it: one compile thread, no library cache."""

    name = "xgrammar"

    def __init__(self, tokenizer: Any, stop_ids: list[int]) -> None:
        self._stop_ids = stop_ids
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=VOCAB_SIZE, stop_token_ids=stop_ids
        )
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    def compile(self, schema: str) -> xgr.CompiledGrammar:
        return self._compiler.compile_json_schema(schema, any_whitespace=False, separators=COMPACT)

    def matcher(self, compiled: xgr.CompiledGrammar) -> XGrammarMatcher:
        return XGrammarMatcher(xgr.GrammarMatcher(compiled, override_stop_tokens=self._stop_ids))


class LLGuidanceMatcher:
    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._matcher = matcher

    def fill(self, bitmask: torch.Tensor) -> None:
        llguidance.torch.fill_next_token_bitmask(self._matcher, bitmask, 0)

    def accept(self, token_id: int) -> bool:
        return bool(self._matcher.consume_token(token_id))

    def finished(self) -> bool:
        return bool(self._matcher.is_stopped())


class LLGuidance:
    """llguidance: a matcher parses its grammar when it is made and builds its lexer lazily,
    so what a cache keeps is a pristine matcher, copied for each request."""

    name = "llguidance"

    def __init__(self, tokenizer: Any, stop_ids: list[int]) -> None:
        self._tokenizer = llguidance.hf.from_tokenizer(
            tokenizer, n_vocab=VOCAB_SIZE, eos_token=stop_ids
        )

    def compile(self, schema: str) -> llguidance.LLMatcher:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False}
        )
        matcher = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"llguidance refused the schema: {matcher.get_error()}")
        return matcher

    def matcher(self, compiled: llguidance.LLMatcher) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(compiled.deep_copy())


@dataclass
class Measures:
    """One backend's figures for one schema (seconds)."""

    cold: list[float] = field(default_factory=list)
    cached: list[float] = field(default_factory=list)
    first_answers: list[float] = field(default_factory=list)  # all its masks, summed
    masks: list[float] = field(default_factory=list)
    accepts: list[float] = field(default_factory=list)


def allowed(bitmask: torch.Tensor, token_id: int) -> bool:
    return bool((int(bitmask[0, token_id // 32]) >> (token_id % 32)) & 1)


def replay(backend: Backend, matcher: Matcher, tokens: list[int], stop_id: int) -> Measures:
    """Fill each position's mask, check the answer's token is allowed, accept it; then the
    stop token, which must end the matcher."""
    out = Measures()
    bitmask = xgr.allocate_token_bitmask(1, VOCAB_SIZE)
    for position, token in enumerate([*tokens, stop_id]):
        started = time.perf_counter()
        matcher.fill(bitmask)
        out.masks.append(time.perf_counter() - started)
        if not allowed(bitmask, token):
            raise SystemExit(f"{backend.name} forbids token {position} ({token}) of the answer")
        started = time.perf_counter()
        ok = matcher.accept(token)
        out.accepts.append(time.perf_counter() - started)
        if not ok:
            raise SystemExit(f"{backend.name} refused token {position} ({token}) of the answer")
    if not matcher.finished():
        raise SystemExit(f"{backend.name} did not finish after the stop token")
    return out


def measure(
    backend: Backend, case: SchemaCase, tokens: list[int], stop_id: int, repeats: int
) -> Measures:
    """`repeats` cold compiles, each followed by the first answer on it (where a lazy
    library does its deferred work); then `repeats` answers from the cached grammar."""
    out = Measures()
    compiled = None
    for _ in range(repeats):
        started = time.perf_counter()
        compiled = backend.compile(case.source)
        matcher = backend.matcher(compiled)
        out.cold.append(time.perf_counter() - started)
        out.first_answers.append(sum(replay(backend, matcher, tokens, stop_id).masks))
    for _ in range(repeats):
        started = time.perf_counter()
        matcher = backend.matcher(compiled)
        out.cached.append(time.perf_counter() - started)
        answer = replay(backend, matcher, tokens, stop_id)
        out.masks += answer.masks
        out.accepts += answer.accepts
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke test)")
    parser.add_argument("--no-write", action="store_true", help="do not touch the docs")
    args = parser.parse_args()
    repeats = 2 if args.quick else 20
    begun = time.perf_counter()

    source = default_model_source()
    tokenizer = AutoTokenizer.from_pretrained(  # type: ignore[no-untyped-call]
        str(source.folder), gguf_file=source.gguf_file
    )
    stop_ids = sorted(find_stop_token_ids(tokenizer, None) | {tokenizer.eos_token_id})
    stop_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    print(f"tokenizer loaded: {len(tokenizer)} tokens, stop ids {stop_ids}", flush=True)
    setups: dict[str, float] = {}
    backends: list[Backend] = []
    for make in (XGrammar, LLGuidance):
        started = time.perf_counter()
        backend = make(tokenizer, stop_ids)
        setups[backend.name] = time.perf_counter() - started
        backends.append(backend)

    results: list[tuple[SchemaCase, int, list[Measures]]] = []
    for case in SCHEMAS:
        jsonschema.validate(case.instance, case.schema)
        tokens = tokenizer.encode(case.answer, add_special_tokens=False)
        measures = [measure(b, case, tokens, stop_id, repeats) for b in backends]
        results.append((case, len(tokens), measures))
        print(
            f"{case.name}: {len(tokens)} tokens, "
            + ", ".join(
                f"{b.name} cold {ms(statistics.median(m.cold))} ms "
                f"mask p50 {us(statistics.median(m.masks))} us"
                for b, m in zip(backends, measures, strict=True)
            ),
            flush=True,
        )
    section = render(backends, setups, results, repeats, time.perf_counter() - begun, args.quick)
    print(section)
    if not args.no_write:
        write_section("grammar-backends", section.rstrip("\n"))
        print("wrote the grammar-backends section of docs/benchmarks.md")


def render(
    backends: list[Backend],
    setups: dict[str, float],
    results: list[tuple[SchemaCase, int, list[Measures]]],
    repeats: int,
    elapsed: float,
    quick: bool,
) -> str:
    names = [b.name for b in backends]
    pair = " / ".join(names)
    command = ".venv/bin/python bench/grammar_backends.py" + (" --quick" if quick else "")
    lines = [
        "### Grammar backends: xgrammar against llguidance",
        "",
        f"Command: `{command}` ({elapsed:.0f} s). Each cell is `{pair}`. Compile: schema "
        "text to a matcher ready for its first mask, both set up the engine's way (compact "
        "JSON, no free whitespace), median of "
        f"{repeats}; cached: a matcher from what a cache keeps (xgrammar's compiled grammar, "
        "a copy of a pristine llguidance matcher). First answer: all the masks of the first "
        "answer replayed on a freshly compiled grammar, summed (llguidance builds its lexer "
        "lazily, during these), median of "
        f"{repeats}. Mask p50 / p99: one token's mask, over every position of {repeats} "
        "replays from the cached grammar. Each replay checks that every token of the answer "
        "is allowed by its mask and that the stop token ends the matcher. One-time setup "
        "for the 49,152-token vocabulary: "
        + ", ".join(f"{name} {setups[name]:.2f} s" for name in names)
        + ".",
        "",
        "| Schema | answer tokens | compile cold, ms | compile cached, ms | first answer's "
        "masks, ms | mask p50, us | mask p99, us | accept p50, us |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def cells(measures: list[Measures], pick: Callable[[Measures], str]) -> str:
        return " / ".join(pick(m) for m in measures)

    def row(label: str, tokens: str, measures: list[Measures]) -> str:
        return (
            f"| {label} | {tokens} "
            f"| {cells(measures, lambda m: ms(statistics.median(m.cold)))} "
            f"| {cells(measures, lambda m: ms(statistics.median(m.cached)))} "
            f"| {cells(measures, lambda m: ms(statistics.median(m.first_answers)))} "
            f"| {cells(measures, lambda m: us(statistics.median(m.masks)))} "
            f"| {cells(measures, lambda m: us(percentile(m.masks, 0.99)))} "
            f"| {cells(measures, lambda m: us(statistics.median(m.accepts)))} |"
        )

    for case, tokens, measures in results:
        lines.append(row(case.name, str(tokens), measures))
    pooled = []
    for index in range(len(backends)):
        every = [measures[index] for _, _, measures in results]
        pooled.append(
            Measures(
                cold=[statistics.median(m.cold) for m in every],
                cached=[statistics.median(m.cached) for m in every],
                first_answers=[statistics.median(m.first_answers) for m in every],
                masks=[x for m in every for x in m.masks],
                accepts=[x for m in every for x in m.accepts],
            )
        )
    total = sum(tokens for _, tokens, _ in results)
    label = "**all** (compile, first answer: median of the schemas' medians)"
    lines.append(row(label, str(total), pooled))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

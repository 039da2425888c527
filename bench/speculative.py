"""Benchmark speculative decoding on RAG answers: the same engine with and without drafts.

    flock /tmp/bench.lock .venv/bin/python bench/speculative.py             # rewrites its section
    flock /tmp/bench.lock .venv/bin/python bench/speculative.py --no-write  # print only

The prompts put a source (a docs/sample-corpus/ file or a Cranfield abstract) in the system
message and ask for an answer that quotes it; decoding is greedy, 128 tokens at most, so
both engines produce the same tokens (checked) and only the time differs. One stream and
16 streams, the median of 3 runs each, on SmolLM2 with the serving default weights.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from doc_section import write_section

from engine import (
    ChatMessage,
    EngineConfig,
    PagedEngine,
    SamplingParams,
    default_model_source,
    resolve_engine_config,
)
from engine.model_source import load_pretrained
from engine.tokenization import encode_chat

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "docs" / "sample-corpus"
CRANFIELD = Path("/work/shared/data/retrieval/cranfield/cran.all.1400")
RUNS = 3
STREAMS = 16
NEW_TOKENS = 128
SPECULATIVE_TOKENS = 8
SYSTEM = "Answer from the source below. Quote its sentences word for word.\n\nSource:\n"


def cranfield_abstracts(count: int) -> list[str]:
    """The first `count` Cranfield abstracts (the .W fields), whitespace normalised."""
    text = CRANFIELD.read_text(encoding="utf-8", errors="replace")
    abstracts = [" ".join(part.split(".I ")[0].split()) for part in text.split("\n.W\n")[1:]]
    return abstracts[:count]


def rag_chats() -> list[tuple[ChatMessage, ...]]:
    """Questions over the sample corpus' sections and Cranfield abstracts."""
    chats: list[tuple[ChatMessage, ...]] = []
    for path in sorted(CORPUS.glob("*.md")):
        sections = re.split(r"\n(?=## )", path.read_text(encoding="utf-8"))[1:]
        for section in sections:
            heading = section.splitlines()[0].removeprefix("## ").strip()
            question = f'What does the source say under "{heading}"? Quote it.'
            chats.append((ChatMessage("system", SYSTEM + section), ChatMessage("user", question)))
    for abstract in cranfield_abstracts(STREAMS):
        question = "What experiment or result does this abstract describe? Quote it."
        chats.append((ChatMessage("system", SYSTEM + abstract), ChatMessage("user", question)))
    return chats


async def _timed(
    engine: PagedEngine, prompts: list[list[int]], params: SamplingParams
) -> tuple[float, float, list[list[int]]]:
    """Seconds until every prompt has its answer, all submitted at once; seconds until the
    first token of the first answer; and the answers."""
    started = time.perf_counter()
    first: list[float] = []

    async def one(prompt: list[int]) -> list[int]:
        answer = []
        async for out in engine.stream_tokens(prompt, params):
            if out.token_id is not None:
                if not first:
                    first.append(time.perf_counter() - started)
                answer.append(out.token_id)
        return answer

    answers = await asyncio.gather(*(one(p) for p in prompts))
    return time.perf_counter() - started, first[0], list(answers)


def measure(
    engine: PagedEngine, batches: list[list[list[int]]], params: SamplingParams, decode: bool
) -> tuple[float, list[list[int]]]:
    """Median tok/s over `batches` (one run each), and every answer: generated tokens over
    the whole run, or with `decode` (one stream) after the first token, as
    bench/engine.py counts a decode rate."""
    rates, answers = [], []
    for prompts in batches:
        engine.call(lambda core: core.blocks.reset_prefix_cache())
        seconds, ttft, outs = asyncio.run(_timed(engine, prompts, params))
        tokens = sum(len(o) for o in outs)
        rates.append((tokens - 1) / (seconds - ttft) if decode else tokens / seconds)
        answers.append(outs)
    return statistics.median(rates), [a for outs in answers for a in outs]


def copied_share(prompt: list[int], answer: list[int], n: int = 4) -> float:
    """The share of answer tokens that end an n-gram found in the prompt (how much it quotes)."""
    grams = {tuple(prompt[i : i + n]) for i in range(len(prompt) - n + 1)}
    full = prompt + answer
    start = len(prompt)
    hits = sum(tuple(full[i - n + 1 : i + 1]) in grams for i in range(start, len(full)))
    return hits / max(1, len(answer))


def run(write: bool) -> str:
    source = default_model_source()
    hf, tokenizer = load_pretrained(source, torch.float32)
    base = EngineConfig(weights="auto")
    configs = {"off": base, "on": replace(base, speculative_tokens=SPECULATIVE_TOKENS)}
    chats = rag_chats()
    prompts = [encode_chat(tokenizer, chat) for chat in chats]
    params = SamplingParams(max_tokens=NEW_TOKENS)
    singles = [[p] for p in prompts[:RUNS]]
    groups = [
        [prompts[(r * STREAMS + i) % len(prompts)] for i in range(STREAMS)] for r in range(RUNS)
    ]
    figures: dict[str, dict[str, float]] = {}
    answers: dict[str, list[list[int]]] = {}
    weights = ""
    for name, config in configs.items():
        engine = PagedEngine.from_hf_model(hf, tokenizer, source.model_id, "cpu", config=config)
        weights = resolve_engine_config(config, "cpu").weights
        engine.generate([prompts[0][:64]], SamplingParams(max_tokens=4, ignore_eos=True))
        one, one_answers = measure(engine, singles, params, decode=True)
        many, many_answers = measure(engine, groups, params, decode=False)
        engine.close()
        figures[name] = {"one": one, "many": many}
        answers[name] = one_answers + many_answers
        print(name, figures[name], flush=True)
    same = sum(a == b for a, b in zip(answers["on"], answers["off"], strict=True))
    quoted = statistics.mean(
        copied_share(p, a) for p, a in zip(prompts[:RUNS], answers["off"][:RUNS], strict=True)
    )
    section = render(figures, weights, quoted, len(prompts), same, len(answers["on"]))
    print(section)
    if write:
        write_section("speculative", section)
    return section


def render(
    figures: dict[str, dict[str, Any]],
    weights: str,
    quoted: float,
    chats: int,
    same: int,
    answers: int,
) -> str:
    off, on = figures["off"], figures["on"]
    rows = [
        ("1 stream: decode tok/s (after the first token)", on["one"], off["one"], ">= 1.8x"),
        (f"{STREAMS} streams: total tok/s", on["many"], off["many"], ">= 0.95x"),
    ]
    lines = [
        "## Speculative decoding on RAG answers",
        "",
        "`flock /tmp/bench.lock .venv/bin/python bench/speculative.py`: SmolLM2-135M-Instruct, "
        f"{weights} weights, greedy, up to {NEW_TOKENS} new tokens, prompt-lookup drafts of up "
        f"to {SPECULATIVE_TOKENS} tokens (`EngineConfig(speculative_tokens="
        f"{SPECULATIVE_TOKENS})`) against the same engine without them, in the same run. "
        f"{chats} questions over docs/sample-corpus/ sections and Cranfield abstracts, the "
        "source in the system message; median of "
        f"{RUNS} runs. {same} of {answers} answers are token for token the same with and "
        "without speculation (a prompt's prefill chunks can fall differently in a batch, "
        "which moves near-tied greedy choices by rounding); "
        f"{quoted:.0%} of the one-stream answers' tokens end a 4-gram of their prompt.",
        "",
        "| scenario | speculation on | off | ratio | goal |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, on_rate, off_rate, goal in rows:
        lines.append(
            f"| {name} | {on_rate:.1f} | {off_rate:.1f} | {on_rate / off_rate:.2f}x | {goal} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true", help="do not touch the docs")
    args = parser.parse_args()
    run(write=not args.no_write)


if __name__ == "__main__":
    main()

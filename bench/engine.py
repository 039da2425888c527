"""Benchmark the paged engine against transformers `generate` on SmolLM2, in one run.

    .venv/bin/python bench/engine.py            # full run, rewrites docs/benchmarks.md
    .venv/bin/python bench/engine.py --quick    # smaller sizes, for a smoke test
    .venv/bin/python bench/engine.py --no-write # print only

A full run ends with bench/speculative.py (speculative decoding on RAG answers), which
writes a section of its own.

Both sides use the same weights and the same number of intra-op threads: the engine's
serving default on this CPU (every core), and one thread in the rows that say so.
Figures on shared machines are noisy: compare the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import platform
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from doc_section import write_section
from model_fidelity import (
    QUESTIONS,
    corpus_ids,
    decode_perplexity,
    engine_perplexity,
    greedy_answers,
    hf_perplexity,
)
from speculative import run as run_speculative
from workloads import prompt_ids

from engine import EngineConfig, PagedEngine, SamplingParams, default_model_source
from engine.linear import WeightFormat
from engine.llama import PagedLlama
from engine.model_source import load_pretrained
from engine.smoothing import calibration_ids


@dataclass
class Row:
    name: str
    engine: str
    baseline: str
    ratio: str
    goal: str


# Each engine scenario runs this many times; the tables quote the median run (a run takes
# seconds, and one disturbed run on these shared machines moved a mean TTFT 1.35 -> 1.73 s).
ENGINE_RUNS = 3

# The formats measured on one thread too (section 6): the serving default (int8, decode
# steps native) and the default without a C compiler (fp16).
ONE_THREAD_FORMATS: tuple[WeightFormat, ...] = ("int8", "fp16")


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def timed_streams(
    engine: PagedEngine, prompts: list[list[int]], params: SamplingParams
) -> list[tuple[float, float, int]]:
    """(time to first token, total time, tokens) per request, all submitted at once."""

    async def one(prompt: list[int]) -> tuple[float, float, int]:
        started = time.perf_counter()
        first = 0.0
        count = 0
        async for out in engine.stream_tokens(prompt, params):
            if out.token_id is not None:
                count += 1
                if count == 1:
                    first = time.perf_counter() - started
        return first, time.perf_counter() - started, count

    return list(await asyncio.gather(*(one(p) for p in prompts)))


def decode_rate(engine: PagedEngine, prompt: list[int], params: SamplingParams) -> float:
    """One stream's decode tok/s, the first token (prefill) left out: the median of
    ENGINE_RUNS runs."""

    def once() -> float:
        ((ttft, total, count),) = asyncio.run(timed_streams(engine, [prompt], params))
        return (count - 1) / (total - ttft)

    return statistics.median(once() for _ in range(ENGINE_RUNS))


def concurrent_rate(engine: PagedEngine, prompts: list[list[int]], params: SamplingParams) -> float:
    """Generated tok/s in total, all `prompts` submitted at once: the median of
    ENGINE_RUNS runs."""

    def once() -> float:
        started = time.perf_counter()
        results = asyncio.run(timed_streams(engine, prompts, params))
        return sum(r[2] for r in results) / (time.perf_counter() - started)

    return statistics.median(once() for _ in range(ENGINE_RUNS))


def cold_ttfts(engine: PagedEngine, prompts: list[list[int]]) -> list[float]:
    """Mean time to first token of `prompts` submitted at once, the prefix cache emptied
    first, in each of ENGINE_RUNS runs."""

    def once() -> float:
        engine.call(lambda core: core.blocks.reset_prefix_cache())
        results = asyncio.run(timed_streams(engine, prompts, SamplingParams(8)))
        return statistics.mean(r[0] for r in results)

    return [once() for _ in range(ENGINE_RUNS)]


def ttft_cell(run_means: list[float]) -> str:
    runs = " / ".join(f"{m:.2f}" for m in run_means)
    return f"{statistics.median(run_means):.2f} (runs {runs})"


def variant(hf: Any, tokenizer: Any, model_id: str, config: EngineConfig) -> PagedEngine:
    """Another engine over the same weights, warmed up."""
    engine = PagedEngine.from_hf_model(hf, tokenizer, model_id, "cpu", config=config)
    engine.generate([prompt_ids(64, 0)], SamplingParams(max_tokens=2, ignore_eos=True))
    return engine


def hf_generate(model: Any, prompts: list[list[int]], new_tokens: int) -> float:
    """Seconds for transformers to generate `new_tokens` for each prompt (one padded batch)."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[2] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    started = time.perf_counter()
    with torch.inference_mode():
        model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=2,
        )
    return time.perf_counter() - started


def hf_prefill_seconds(model: Any, prompt: list[int], repeats: int) -> float:
    ids = torch.tensor([prompt])
    times = []
    with torch.inference_mode():
        for _ in range(repeats):
            started = time.perf_counter()
            model(input_ids=ids, use_cache=False, logits_to_keep=1)
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def engine_prefill_seconds(engine: PagedEngine, prompt: list[int], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        engine.call(lambda core: core.blocks.reset_prefix_cache())  # measure a cold prefill
        started = time.perf_counter()
        engine.generate([prompt], SamplingParams(max_tokens=1, ignore_eos=True))
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def perplexity_row(name: str, perplexities: list[float], hf_ppl: float) -> Row:
    """Each format's perplexity, and its ratio to transformers' fp32 one."""
    return Row(
        name,
        " / ".join(f"{ppl:.2f}" for ppl in perplexities),
        f"{hf_ppl:.2f} (fp32)",
        " / ".join(f"{ppl / hf_ppl:.3f}" for ppl in perplexities),
        "-",
    )


def one_thread_rows(
    hf: Any,
    tokenizer: Any,
    model_id: str,
    prompt: list[int],
    prompts: list[list[int]],
    prefixed: list[list[int]],
    params: SamplingParams,
) -> list[Row]:
    """Scenarios 1-3 with `ONE_THREAD_FORMATS`, and transformers, on one intra-op thread
    each (`BASTION_ENGINE_THREADS=1`, for a CPU shared with other work)."""
    new_tokens = params.max_tokens
    torch.set_num_threads(1)
    hf_decode = (new_tokens - 1) / (
        hf_generate(hf, [prompt], new_tokens) - hf_generate(hf, [prompt], 1)
    )
    hf_tps = len(prompts) * new_tokens / hf_generate(hf, prompts, new_tokens)
    baseline = "(fp32, 1 thread)"
    rows: list[Row] = []
    for fmt in ONE_THREAD_FORMATS:
        config = EngineConfig(kv_cache_mb=128, weights=fmt, num_threads=1)
        engine = variant(hf, tokenizer, model_id, config)
        decode = decode_rate(engine, prompt, params)
        tps = concurrent_rate(engine, prompts, params)
        ttfts = cold_ttfts(engine, prefixed)
        engine.close()
        label = f"{fmt} weights, both sides on 1 thread"
        rows += [
            Row(
                f"{label}: 1 stream decode tok/s",
                f"{decode:.1f}",
                f"{hf_decode:.1f} {baseline}",
                f"{decode / hf_decode:.2f}x",
                ">= 5x",
            ),
            Row(
                f"{label}: {len(prompts)} concurrent, total tok/s",
                f"{tps:.1f}",
                f"{hf_tps:.1f} {baseline}",
                f"{tps / hf_tps:.2f}x",
                ">= 300 tok/s",
            ),
            Row(
                f"{label}: 800-token shared prefix, mean TTFT s",
                ttft_cell(ttfts),
                "-",
                "-",
                "<= 1.5 s",
            ),
        ]
        print(rows[-3:], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (smoke test)")
    parser.add_argument("--no-write", action="store_true", help="do not touch the docs")
    parser.add_argument("--requests", type=int, default=240, help="memory-check requests")
    args = parser.parse_args()
    quick = args.quick
    new_tokens = 32 if quick else 128
    concurrency = 16
    memory_requests = 48 if quick else args.requests
    load_before = os.getloadavg()[0]
    begun = time.perf_counter()

    source = default_model_source()
    hf, tokenizer = load_pretrained(source, torch.float32)
    config = EngineConfig()
    threads = config.threads_for("cpu") or torch.get_num_threads()
    torch.set_num_threads(threads)  # the baseline gets what the engine thread gets
    engine = PagedEngine.from_hf_model(hf, tokenizer, source.model_id, "cpu", config=config)
    rows: list[Row] = []
    engine.generate([prompt_ids(64, 0)], SamplingParams(max_tokens=4, ignore_eos=True))
    print("warmed up", flush=True)

    # 1. One stream: 128-token prompt, 128 new tokens; decode rate excludes the first token.
    prompt = prompt_ids(128, 1)
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    engine_decode = decode_rate(engine, prompt, params)
    hf_one = hf_generate(hf, [prompt], 1)
    hf_all = hf_generate(hf, [prompt], new_tokens)
    hf_decode = (new_tokens - 1) / (hf_all - hf_one)
    rows.append(
        Row(
            f"1 stream, 128-token prompt + {new_tokens} new: decode tok/s",
            f"{engine_decode:.1f}",
            f"{hf_decode:.1f}",
            f"{engine_decode / hf_decode:.2f}x",
            ">= 5x",
        )
    )
    print(rows[-1], flush=True)

    # 2. 16 concurrent requests of ~110 tokens, 128 new each: total generated tok/s.
    prompts = [prompt_ids(100 + 2 * i, 10 + i) for i in range(concurrency)]
    engine_tps = concurrent_rate(engine, prompts, params)
    hf_tps = concurrency * new_tokens / hf_generate(hf, prompts, new_tokens)
    rows.append(
        Row(
            f"{concurrency} concurrent, ~110-token prompts + {new_tokens} new: total tok/s",
            f"{engine_tps:.1f}",
            f"{hf_tps:.1f} (padded batch)",
            f"{engine_tps / hf_tps:.2f}x",
            ">= 300 tok/s",
        )
    )
    print(rows[-1], flush=True)

    # 3. 16 concurrent requests sharing an 800-token prefix: mean time to first token.
    shared = prompt_ids(800, 50)
    prefixed = [shared + prompt_ids(20, 60 + i) for i in range(concurrency)]
    ttfts = cold_ttfts(engine, prefixed)
    hit_rate = engine.metrics().prefix_cache_hit_rate
    rows.append(
        Row(
            f"{concurrency} concurrent sharing an 800-token prefix: mean TTFT s",
            ttft_cell(ttfts),
            "-",
            "-",
            "<= 1.5 s",
        )
    )
    print(rows[-1], f"cumulative hit rate {hit_rate:.2f}", flush=True)

    # 4. Prefill of a 1,024-token prompt, against transformers in bf16 (and fp32).
    long_prompt = prompt_ids(1024, 70)
    repeats = 1 if quick else 5
    engine_prefill = 1024 / engine_prefill_seconds(engine, long_prompt, repeats)
    hf_fp32_prefill = 1024 / hf_prefill_seconds(hf, long_prompt, repeats)
    hf_bf16 = copy.deepcopy(hf).to(torch.bfloat16)
    hf_bf16_prefill = 1024 / hf_prefill_seconds(hf_bf16, long_prompt, repeats)
    del hf_bf16
    bf16_config = EngineConfig(kv_cache_mb=128, dtype="bfloat16")
    bf16_engine = variant(hf, tokenizer, source.model_id, bf16_config)
    engine_bf16_prefill = 1024 / engine_prefill_seconds(bf16_engine, long_prompt, repeats)
    bf16_tps = concurrent_rate(bf16_engine, prompts, params)
    bf16_ttfts = cold_ttfts(bf16_engine, prefixed)
    bf16_engine.close()
    rows.append(
        Row(
            "prefill of a 1,024-token prompt: tok/s (engine fp32 / engine bf16)",
            f"{engine_prefill:.0f} / {engine_bf16_prefill:.0f}",
            f"bf16 {hf_bf16_prefill:.0f}, fp32 {hf_fp32_prefill:.0f}",
            f"{engine_prefill / hf_bf16_prefill:.2f}x / "
            f"{engine_bf16_prefill / hf_bf16_prefill:.2f}x of HF bf16",
            ">= HF bf16",
        )
    )
    print(rows[-1], flush=True)
    rows.append(
        Row(
            f"same {concurrency} concurrent requests, engine in bf16 (greedy differs from fp32)",
            f"{bf16_tps:.1f} tok/s",
            f"{hf_tps:.1f} (fp32)",
            f"{bf16_tps / hf_tps:.2f}x",
            ">= 300 tok/s",
        )
    )
    rows.append(
        Row(
            "800-token shared prefix, engine in bf16: mean TTFT s",
            ttft_cell(bf16_ttfts),
            "-",
            "-",
            "<= 1.5 s",
        )
    )
    print(rows[-2:], flush=True)

    # 5. Compact weights, bf16 activations: int8 (the serving default on a CPU, decode steps
    # native), fp16 (the default without a C compiler), w8a8.
    quantized_formats: list[tuple[WeightFormat, str]] = [
        ("int8", "int8 weights, native decode (serving default on CPU)"),
        ("fp16", "fp16 weights"),
        ("w8a8", "w8a8 weights"),
    ]
    for fmt, label in quantized_formats:
        fmt_config = EngineConfig(kv_cache_mb=128, weights=fmt)
        quantized = variant(hf, tokenizer, source.model_id, fmt_config)
        decode = decode_rate(quantized, prompt, params)
        tps = concurrent_rate(quantized, prompts, params)
        quantized_ttfts = cold_ttfts(quantized, prefixed)
        quantized.close()
        rows += [
            Row(
                f"engine with {label}: 1 stream decode tok/s",
                f"{decode:.1f}",
                f"{hf_decode:.1f} (fp32)",
                f"{decode / hf_decode:.2f}x",
                ">= 5x",
            ),
            Row(
                f"engine with {label}: {concurrency} concurrent, total tok/s",
                f"{tps:.1f}",
                f"{hf_tps:.1f} (fp32)",
                f"{tps / hf_tps:.2f}x",
                ">= 300 tok/s",
            ),
            Row(
                f"engine with {label}: 800-token shared prefix, mean TTFT s",
                ttft_cell(quantized_ttfts),
                "-",
                "-",
                "<= 1.5 s",
            ),
        ]
        print(rows[-3:], flush=True)

    # 6. The serving default and fp16 on one thread each, as on a CPU shared with other work.
    if threads > 1:
        rows += one_thread_rows(hf, tokenizer, source.model_id, prompt, prompts, prefixed, params)
        torch.set_num_threads(threads)

    # What the formats cost: perplexity of one text, and greedy answers against float32's.
    text = corpus_ids(tokenizer, 1024)
    formats: list[tuple[str, torch.dtype, WeightFormat]] = [
        ("fp32", torch.float32, "float"),
        ("bf16", torch.bfloat16, "float"),
        ("fp16", torch.bfloat16, "fp16"),
        ("int8", torch.bfloat16, "int8"),
        ("w8a8", torch.bfloat16, "w8a8"),
    ]
    perplexities: list[float] = []
    decode_perplexities: list[float] = []
    agreements: list[int] = []
    reference: list[list[int]] = []
    for _, dtype, weights in formats:
        model = PagedLlama.from_hf(
            hf, torch.device("cpu"), dtype, weights, calibration_ids(tokenizer)
        )
        perplexities.append(engine_perplexity(model, text))
        decode_perplexities.append(decode_perplexity(model, text))
        answers = greedy_answers(model, tokenizer)
        reference = reference or answers
        agreements.append(sum(a == b for a, b in zip(answers, reference, strict=True)))
    names = " / ".join(name for name, _, _ in formats)
    hf_ppl = hf_perplexity(hf, text)
    rows += [
        perplexity_row(
            f"perplexity of {len(text)} tokens of docs/ (lower is better): {names}",
            perplexities,
            hf_ppl,
        ),
        perplexity_row(
            "the same perplexity through decode steps, one token at a time (int8: native): "
            f"{names}",
            decode_perplexities,
            hf_ppl,
        ),
        Row(
            f"greedy answers (10 tokens, decode steps) to {len(QUESTIONS)} short questions "
            f"equal to the engine's fp32 ones: {names}",
            " / ".join(str(n) for n in agreements),
            "-",
            "-",
            "-",
        ),
    ]
    print(rows[-2:], flush=True)

    # 7. Resident memory across many requests, after warm-up.
    batch = [prompt_ids(40 + (i % 7) * 9, 1000 + i) for i in range(memory_requests)]
    short = SamplingParams(max_tokens=8, ignore_eos=True)
    warm = memory_requests // 4
    # In waves of 32, the most the engine runs at once: a bigger burst is refused (429).
    for start in range(0, warm, 32):
        engine.generate(batch[start : min(start + 32, warm)], short)
    rss_warm = rss_mb()
    for start in range(warm, memory_requests, 32):
        engine.generate(batch[start : start + 32], short)
    rss_end = rss_mb()
    metrics = engine.metrics()
    rows.append(
        Row(
            f"resident memory over {memory_requests} requests (after {warm} warm-up): MiB",
            f"{rss_warm:.0f} -> {rss_end:.0f} ({rss_end - rss_warm:+.0f})",
            "-",
            "-",
            "flat",
        )
    )
    print(rows[-1], flush=True)
    if metrics.kv_blocks_used != 0:
        raise SystemExit(f"blocks leaked: {metrics}")
    engine.close()

    elapsed = time.perf_counter() - begun
    section = render(rows, threads, load_before, elapsed, quick, args)
    print(section)
    if not args.no_write:
        write_section("engine", section.rstrip("\n"))
        print("wrote the engine section of docs/benchmarks.md")
    if not quick:
        # 8. Speculative decoding on RAG answers, in a section of its own.
        run_speculative(write=not args.no_write)


def cpu_name() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown CPU"
    match = re.search(r"model name\s*:\s*(.+)", text)
    return match.group(1).strip() if match else "unknown CPU"


def render(
    rows: list[Row], threads: int, load: float, elapsed: float, quick: bool, args: Any
) -> str:
    command = ".venv/bin/python bench/engine.py" + (" --quick" if quick else "")
    if not quick and args.requests != 240:
        command += f" --requests {args.requests}"
    lines = [
        "## Engine",
        "",
        f"Command: `{command}` ({elapsed / 60:.1f} min). Machine: {cpu_name()}, "
        f"{os.cpu_count()} cores, torch {torch.__version__}, fp32 on CPU unless stated; the "
        f"engine and the transformers baseline both run {threads} intra-op thread(s) (one "
        "in the rows that say so); load "
        f"average {load:.1f} when the run started (the cores are shared with other work, so "
        "absolute figures are noisy and ratios matter). Baseline: transformers `generate` "
        "on the same SmolLM2-135M-Instruct weights in the same process. Engine figures are "
        f"the median of {ENGINE_RUNS} runs (TTFT: each run's mean over its requests, every "
        "run shown).",
        "",
        "| Scenario | Paged engine | transformers | Ratio | Goal |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {r.name} | {r.engine} | {r.baseline} | {r.ratio} | {r.goal} |" for r in rows]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

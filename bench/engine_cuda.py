"""The paged engine on CUDA against transformers `generate`, on a random-weight model of
SmolLM2-135M's shape: the CUDA part of the engine issue, in one command.

    .venv/bin/python bench/engine_cuda.py            # on a CUDA machine; rewrites its section
    .venv/bin/python bench/engine_cuda.py --device cpu --quick --no-write   # smoke test

Correctness first, in float32 with TF32 off: the engine's greedy ids against transformers'
for prompts of 1 to ~1,500 tokens, each alone, all in one batch, and again with the prefix
cache warm. Then speed in bf16, both sides in the same run: one stream and a batch of 256
(128-token prompts, 128 new tokens), counted the same way on both sides (new tokens over
the whole request, prefill included). Measured on the H200 before: transformers 44.6 tok/s
at batch 1 and 7,836 tok/s at batch 256; the goal is 10x both.

On the device machine (`device` tool), its own python3 holds torch and a transformers
other than ours (5.x there): carry wheels of structlog and of this project's transformers
(`pip download --no-deps -d .whl structlog transformers==<ours>` here; there
`python3 -m pip install --no-deps .whl/*` first), then run
`PYTHONPATH=. python3 bench/engine_cuda.py`. Never run there so far: no session was lent
a device.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from doc_section import write_section
from workloads import prompt_ids

from engine import EngineConfig, PagedEngine, SamplingParams

# SmolLM2-135M-Instruct's dimensions (its config.json), with random weights.
SMOLLM2_SHAPE = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 8192,
    "rope_theta": 100000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
}


def smollm2_shaped(dtype: torch.dtype, device: str, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_SHAPE)).eval()
    model.generation_config.eos_token_id = None  # random ids: nothing ends a sequence
    return model.to(device=device, dtype=dtype)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


@torch.inference_mode()
def hf_generate(
    model: LlamaForCausalLM, prompts: list[list[int]], new_tokens: int
) -> list[list[int]]:
    """transformers' greedy continuation of `prompts` in one left-padded batch."""
    width = max(len(p) for p in prompts)
    device = model.device
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    out = model.generate(  # type: ignore[operator]
        ids,
        attention_mask=mask,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    return [row[width:] for row in out.tolist()]


def engine_ids(engine: PagedEngine, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
    outputs = engine.generate(prompts, params)
    return [[o.token_id for o in outs if o.token_id is not None] for outs in outputs]


def agreement(got: list[list[int]], expected: list[list[int]]) -> tuple[int, int, int]:
    """(sequences identical, tokens equal, tokens in all)."""
    same = sum(g == e for g, e in zip(got, expected, strict=True))
    pairs = zip(got, expected, strict=True)
    tokens = sum(a == b for g, e in pairs for a, b in zip(g, e, strict=False))
    return same, tokens, sum(len(e) for e in expected)


def correctness_rows(device: str, quick: bool) -> list[tuple[str, str]]:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = smollm2_shaped(torch.float32, device)
    lengths = [1, 7, 64, 300] if quick else [1, 7, 64, 300, 800, 1500]
    new_tokens = 8 if quick else 16
    prompts = [prompt_ids(n, seed=n) for n in lengths]
    expected = [hf_generate(model, [p], new_tokens)[0] for p in prompts]
    config = EngineConfig(kv_cache_mb=512, dtype="float32", max_num_seqs=32)
    engine = PagedEngine.from_hf_model(model, None, "smollm2-shaped", device, config=config)
    try:
        runs = {
            "each alone": [engine_ids(engine, [p], new_tokens)[0] for p in prompts],
            "all in one batch": engine_ids(engine, prompts, new_tokens),
            "all again, prefix cache warm": engine_ids(engine, prompts, new_tokens),
        }
        hit_rate = engine.metrics().prefix_cache_hit_rate
    finally:
        engine.close()
    rows = []
    for name, got in runs.items():
        same, tokens, total = agreement(got, expected)
        rows.append(
            (
                f"greedy ids, fp32, prompts of {lengths[0]}-{lengths[-1]} tokens, {name}",
                f"{same} of {len(prompts)} sequences identical; {tokens} of {total} tokens",
            )
        )
    rows.append(("prefix-cache hit rate over the three runs", f"{hit_rate:.2f}"))
    del model
    return rows


def timed(device: str, run: Callable[[], object]) -> float:
    sync(device)
    started = time.perf_counter()
    run()
    sync(device)
    return time.perf_counter() - started


def speed_rows(device: str, quick: bool) -> list[tuple[str, str]]:
    model = smollm2_shaped(torch.bfloat16, device)
    new_tokens = 16 if quick else 128
    batches = [1, 8] if quick else [1, 256]
    config = EngineConfig(
        kv_cache_mb=1024 if quick else 8192,
        dtype="bfloat16",
        max_num_seqs=max(batches),
        max_batched_tokens=max(2048, max(batches)),
        max_waiting=max(batches),
    )
    engine = PagedEngine.from_hf_model(model, None, "smollm2-shaped", device, config=config)
    rows = []
    try:
        engine_ids(engine, [prompt_ids(128, seed=1)], 4)  # warm-up
        hf_generate(model, [prompt_ids(128, seed=1)], 4)
        for batch in batches:
            prompts = [prompt_ids(128, seed=100 + i) for i in range(batch)]
            engine.call(lambda core: core.blocks.reset_prefix_cache())
            engine_s = timed(device, lambda p=prompts: engine_ids(engine, p, new_tokens))
            hf_s = timed(device, lambda p=prompts: hf_generate(model, p, new_tokens))
            engine_rate, hf_rate = batch * new_tokens / engine_s, batch * new_tokens / hf_s
            rows.append(
                (
                    f"bf16, batch {batch}, 128-token prompts + {new_tokens} new: tok/s "
                    "(engine / transformers / ratio; goal 10x)",
                    f"{engine_rate:.1f} / {hf_rate:.1f} / {engine_rate / hf_rate:.2f}x",
                )
            )
            print(rows[-1], flush=True)
    finally:
        engine.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (the point), or cpu to smoke-test")
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    parser.add_argument("--no-write", action="store_true", help="do not touch the docs")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: pass --device cpu for a smoke test")
    began = time.perf_counter()
    rows = correctness_rows(args.device, args.quick)
    for row in rows:
        print(row, flush=True)
    rows += speed_rows(args.device, args.quick)
    name = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    command = "bench/engine_cuda.py" + (" --quick" if args.quick else "")
    lines = [
        "## Engine on CUDA",
        "",
        f"Command: `.venv/bin/python {command}` ({(time.perf_counter() - began) / 60:.1f} "
        f"min) on {name}, torch {torch.__version__}. A random-weight model of "
        "SmolLM2-135M's shape; transformers `generate` on the same weights in the same run.",
        "",
        "| measure | result |",
        "| --- | --- |",
        *[f"| {measure} | {result} |" for measure, result in rows],
    ]
    section = "\n".join(lines)
    print(section)
    if not args.no_write and args.device == "cuda":
        write_section("engine-cuda", section)


if __name__ == "__main__":
    main()

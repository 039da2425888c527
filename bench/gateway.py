"""Through the gateway against the engine alone, in one run (issue 19's goals).

    .venv/bin/python bench/gateway.py             # rewrites the gateway section of the doc
    .venv/bin/python bench/gateway.py --quick --no-write

The engine alone (the paged engine as `bastion serve` configures it, in this process, fed
the very messages the gateway gives it) and one `bastion serve` process on a fresh data
folder, driven over HTTP with streamed chat requests, take turns; the same questions,
greedy, so both sides generate the same tokens (the bench checks that the prompt token
counts match).
Tenants: `plain` (the default policy without retrieval: the gateway's prompt is then the
policy's system prompt and the question, which the engine alone is given too), `default`
(the default policy: retrieval over docs/sample-corpus) and `allchecks` (the default
policy with the topic allow-list on: injection, PII, topics and retrieval).
A transformers `generate` row (fp32, the same threads) anchors both.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from doc_section import write_section  # noqa: E402  (bench/ is on the path)
from load import Server, start_server, stop_server  # noqa: E402
from shared_prompt import questions, shared_system_message  # noqa: E402

from engine import (  # noqa: E402
    ChatMessage,
    GenerationRequest,
    PagedEngine,
    SamplingParams,
    default_model_source,
)
from engine.model_source import load_pretrained  # noqa: E402
from engine.tokenization import encode_chat  # noqa: E402
from gateway.db.connection import make_db_engine, make_session_factory  # noqa: E402
from gateway.keys.store import create_key  # noqa: E402
from gateway.services import load_engine  # noqa: E402
from gateway.settings import Settings  # noqa: E402

CHAT_PATH = "/v1/chat/completions"
MAX_TOKENS = 96
SYSTEM_PROMPT = (
    "You are Northwind's internal assistant. Answer briefly and truthfully. When sources "
    "are given, answer from them and cite them as [1], [2]."
)
TOPICS = {
    "enabled": True,
    "mode": "enforce",
    "threshold": 0.2,
    "allowed": [
        {
            "name": "it-support",
            "description": "Questions about laptops, VPN, passwords, accounts and software.",
        },
        {
            "name": "hr",
            "description": "Questions about vacation, expenses, travel, pay and working abroad.",
        },
    ],
}


@dataclass
class Stream:
    """One streamed answer as its client saw it."""

    ttft_s: float
    total_s: float
    completion_tokens: int
    prompt_tokens: int
    decode_s: float  # first token to last


def decode_rate(streams: list[Stream]) -> float:
    """Median tokens a second after the first token, one stream at a time."""
    return statistics.median(
        (s.completion_tokens - 1) / s.decode_s for s in streams if s.decode_s > 0
    )


def aggregate_rate(streams: list[Stream], wall_s: float) -> float:
    return sum(s.completion_tokens for s in streams) / wall_s


# -- the engine alone ----------------------------------------------------------------------


async def engine_stream(engine: PagedEngine, messages: list[ChatMessage]) -> Stream:
    request = GenerationRequest(
        request_id=uuid.uuid4().hex,
        messages=tuple(messages),
        sampling=SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0),
        cache_salt="bench",
    )
    started = time.perf_counter()
    first = last = started
    tokens = prompt = 0
    async for delta in engine.stream(request):
        now = time.perf_counter()
        if delta.text and first == started:
            first = now
        last = now
        tokens, prompt = delta.completion_tokens, delta.prompt_tokens
    return Stream(first - started, last - started, tokens, prompt, last - first)


async def engine_runs(
    engine: PagedEngine, prompts: list[list[ChatMessage]], concurrent: bool
) -> tuple[list[Stream], float]:
    started = time.perf_counter()
    if concurrent:
        streams = list(await asyncio.gather(*(engine_stream(engine, p) for p in prompts)))
    else:
        streams = [await engine_stream(engine, p) for p in prompts]
    return streams, time.perf_counter() - started


def transformers_rate(prompts: list[list[ChatMessage]]) -> float:
    """Median tokens a second of transformers `generate` (fp32, greedy, one prompt at a
    time, the prefill included), on as many threads as the engine."""
    model, tokenizer = load_pretrained(default_model_source(), torch.float32)
    rates = []
    for messages in prompts:
        ids = torch.tensor([encode_chat(tokenizer, messages)])
        started = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False)
        rates.append((out.shape[1] - ids.shape[1]) / (time.perf_counter() - started))
    return statistics.median(rates)


# -- through the gateway -------------------------------------------------------------------


async def gateway_stream(
    client: httpx.AsyncClient, key: str, messages: list[dict[str, str]]
) -> Stream:
    body = {
        "messages": messages,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first = last = started
    usage: dict[str, int] = {}
    async with client.stream(
        "POST", CHAT_PATH, json=body, headers={"authorization": f"Bearer {key}"}
    ) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            choices = chunk.get("choices") or [{}]
            if choices[0].get("delta", {}).get("content"):
                now = time.perf_counter()
                if first == started:
                    first = now
                last = now
    return Stream(
        first - started,
        last - started,
        int(usage.get("completion_tokens", 0)),
        int(usage.get("prompt_tokens", 0)),
        last - first,
    )


async def gateway_runs(
    server: Server, key: str, prompts: list[list[dict[str, str]]], concurrent: bool
) -> tuple[list[Stream], float]:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=600) as client:
        started = time.perf_counter()
        if concurrent:
            streams = list(await asyncio.gather(*(gateway_stream(client, key, p) for p in prompts)))
        else:
            streams = [await gateway_stream(client, key, p) for p in prompts]
        return streams, time.perf_counter() - started


def overheads(server: Server, key: str, count: int) -> list[float]:
    """`x-bastion-overhead-ms` of `count` non-streamed requests, one at a time."""
    values = []
    with httpx.Client(base_url=server.base_url, timeout=600) as client:
        for question in questions(count):
            response = client.post(
                CHAT_PATH,
                json={"messages": [{"role": "user", "content": question}], "max_tokens": 4},
                headers={"authorization": f"Bearer {key}"},
            )
            response.raise_for_status()
            values.append(float(response.headers["x-bastion-overhead-ms"]))
    return values


def write_policies(policy_dir: Path) -> None:
    """The default policy, and its `plain` and `allchecks` variants (see the docstring)."""
    default = yaml.safe_load((ROOT / "policies" / "default.yaml").read_text(encoding="utf-8"))
    plain = copy.deepcopy(default)
    plain["retrieval"]["enabled"] = False
    everything = copy.deepcopy(default)
    everything["input"]["topics"] = TOPICS
    policy_dir.mkdir(parents=True, exist_ok=True)
    for name, policy in (("default", default), ("plain", plain), ("allchecks", everything)):
        policy["name"], policy["applies_to"] = name, {"tenants": [name]}
        (policy_dir / f"{name}.yaml").write_text(yaml.safe_dump(policy), encoding="utf-8")


def tenant_keys(data_dir: Path) -> dict[str, str]:
    sessions = make_session_factory(make_db_engine(f"sqlite:///{data_dir / 'bastion.db'}"))
    return {t: create_key(sessions, t, "user")[0] for t in ("default", "plain", "allchecks")}


# -- the report ----------------------------------------------------------------------------


@dataclass
class Round:
    """One round's figures on one side (the engine alone, or through the gateway)."""

    one_stream: list[Stream]
    sixteen: list[Stream]
    sixteen_s: float
    shared: list[Stream]

    @property
    def one_rate(self) -> float:
        return decode_rate(self.one_stream)

    @property
    def sixteen_rate(self) -> float:
        return aggregate_rate(self.sixteen, self.sixteen_s)

    @property
    def shared_ttft(self) -> float:
        return statistics.mean(s.ttft_s for s in self.shared)


def alone_round(engine: PagedEngine, qs: list[str], system: str, singles: int) -> Round:
    plain = [[ChatMessage("system", SYSTEM_PROMPT), ChatMessage("user", q)] for q in qs]
    shared = [
        [ChatMessage("system", f"{SYSTEM_PROMPT}\n\n{system}"), ChatMessage("user", q)] for q in qs
    ]
    one, _ = asyncio.run(engine_runs(engine, plain[:singles], concurrent=False))
    sixteen, sixteen_s = asyncio.run(engine_runs(engine, plain, concurrent=True))
    asyncio.run(engine_runs(engine, shared[:1], concurrent=False))
    together, _ = asyncio.run(engine_runs(engine, shared[1:16], concurrent=True))
    return Round(one, sixteen, sixteen_s, together)


def gateway_round(
    server: Server, keys: dict[str, str], qs: list[str], system: str, singles: int
) -> Round:
    # The policy's system prompt is the gateway's own: clients send the question.
    plain = [[{"role": "user", "content": q}] for q in qs]
    shared = [[{"role": "system", "content": system}, {"role": "user", "content": q}] for q in qs]
    one, _ = asyncio.run(gateway_runs(server, keys["plain"], plain[:singles], concurrent=False))
    sixteen, sixteen_s = asyncio.run(gateway_runs(server, keys["plain"], plain, concurrent=True))
    asyncio.run(gateway_runs(server, keys["default"], shared[:1], concurrent=False))
    together, _ = asyncio.run(gateway_runs(server, keys["default"], shared[1:16], concurrent=True))
    return Round(one, sixteen, sixteen_s, together)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    singles = 3 if args.quick else 6
    rounds = 1 if args.quick else 3
    overhead_requests = 15 if args.quick else 60
    started = time.time()
    system = shared_system_message()

    print("transformers ...", flush=True)
    first_questions = questions(16)
    hf_rate = transformers_rate(
        [[ChatMessage("system", SYSTEM_PROMPT), ChatMessage("user", q)] for q in first_questions][
            :singles
        ]
    )
    alone: list[Round] = []
    gate: list[Round] = []
    with tempfile.TemporaryDirectory() as tmp:
        data_dir, policy_dir = Path(tmp) / "data", Path(tmp) / "policies"
        write_policies(policy_dir)
        os.environ["BASTION_POLICY_DIR"] = str(policy_dir)
        data_dir.mkdir()
        server = start_server(data_dir, Path(tmp) / "serve.log")
        engine = load_engine(Settings())
        assert isinstance(engine, PagedEngine)
        try:
            keys = tenant_keys(data_dir)
            time.sleep(1.0)  # the policy registry binds the new tenants' keys' policies
            warm = questions(2)
            asyncio.run(
                gateway_runs(
                    server,
                    keys["plain"],
                    [[{"role": "user", "content": q}] for q in warm],
                    concurrent=False,
                )
            )
            asyncio.run(
                engine_runs(
                    engine,
                    [[ChatMessage("system", SYSTEM_PROMPT), ChatMessage("user", q)] for q in warm],
                    concurrent=False,
                )
            )
            # Both sides in turns, so that a busy spell on this shared machine falls on
            # both alike; each round asks new questions (no whole prompt is cached).
            for r in range(rounds):
                qs = [f"{q} (round {r})" for q in first_questions]
                print(f"round {r + 1} of {rounds} ...", flush=True)
                alone.append(alone_round(engine, qs, system, singles))
                gate.append(gateway_round(server, keys, qs, system, singles))
            overhead = overheads(server, keys["allchecks"], overhead_requests)
            overhead_default = overheads(server, keys["default"], overhead_requests)
        finally:
            engine.close()
            stop_server(server)

    mismatched = [
        (a.prompt_tokens, g.prompt_tokens)
        for a, g in zip(alone[0].one_stream, gate[0].one_stream, strict=True)
        if a.prompt_tokens != g.prompt_tokens
    ]
    if mismatched:
        raise RuntimeError(f"the gateway's prompts differ from the engine's: {mismatched}")

    def median(side: list[Round], figure: str) -> float:
        return statistics.median(getattr(r, figure) for r in side)

    one_alone, one_gate = median(alone, "one_rate"), median(gate, "one_rate")
    many_alone, many_gate = median(alone, "sixteen_rate"), median(gate, "sixteen_rate")
    ttft_alone, ttft_gate = median(alone, "shared_ttft"), median(gate, "shared_ttft")
    ttft_one_alone = statistics.median(s.ttft_s for r in alone for s in r.one_stream)
    ttft_one_gate = statistics.median(s.ttft_s for r in gate for s in r.one_stream)
    warm_all = overhead[5:]
    warm_default = overhead_default[5:]
    rows = [
        "| what | engine alone | through the gateway | ratio | goal |",
        "| --- | ---: | ---: | ---: | --- |",
        f"| one stream, decode tok/s (median of {singles} answers, of {rounds} rounds) | "
        f"{one_alone:.1f} | {one_gate:.1f} "
        f"| {one_gate / one_alone:.2f} | >= 0.9 |",
        f"| one stream against transformers | {one_alone / hf_rate:.1f}x | "
        f"{one_gate / hf_rate:.1f}x | | |",
        f"| one stream, time to first token, median s | "
        f"{ttft_one_alone:.3f} | {ttft_one_gate:.3f} | | |",
        f"| transformers `generate`, one stream, tok/s (the anchor) | {hf_rate:.1f} | "
        f"{hf_rate:.1f} | | |",
        f"| 16 streams, tok/s in all | {many_alone:.1f} | {many_gate:.1f} "
        f"| {many_gate / many_alone:.2f} | >= 0.85 |",
        f"| 15 concurrent sharing an ~800-token client system message (after one warm "
        f"request), mean time to first token, s | {ttft_alone:.2f} | {ttft_gate:.2f} | "
        f"| gateway <= 1.0 |",
    ]
    body = "\n".join(
        [
            "## Through the gateway",
            "",
            f"Command: `.venv/bin/python bench/gateway.py{' --quick' if args.quick else ''}`"
            f" ({time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} cores, "
            f"load average {os.getloadavg()[0]:.1f} at the end; {time.time() - started:.0f} s).",
            "",
            "Greedy, at most 96 tokens, streamed with usage. The one-stream and 16-stream rows "
            "use the default policy without retrieval, so the gateway gives the engine the "
            "same messages as the engine-alone side (the prompt token counts are checked "
            "equal); the shared-system row uses the default policy (retrieval on: each "
            "question brings its own sources after the shared part). The engine alone runs "
            "in this process beside the server, and the two sides take turns, round by "
            "round, each with new questions; the tables quote medians over the rounds. "
            "Through the gateway, the first token is the first text the output checks "
            "release: with the default policy, once its first word has ended and no check "
            "can still need it (`OutputGuardrails.hold_from`), at the latest 48 characters "
            "behind the answer's end.",
            "",
            *rows,
            "",
            f"Gateway overhead (`x-bastion-overhead-ms`, {overhead_requests} non-streamed "
            "requests one at a time, the first 5 left out):",
            "",
            "| policy | p50 ms | p90 ms | first 5 | goal |",
            "| --- | ---: | ---: | --- | --- |",
            f"| injection, PII, topics and retrieval on | {statistics.median(warm_all):.1f} | "
            f"{statistics.quantiles(warm_all, n=10)[-1]:.1f} | "
            f"{', '.join(f'{v:.0f}' for v in overhead[:5])} | p50 <= 20 |",
            f"| default (topics off) | {statistics.median(warm_default):.1f} | "
            f"{statistics.quantiles(warm_default, n=10)[-1]:.1f} | "
            f"{', '.join(f'{v:.0f}' for v in overhead_default[:5])} | |",
        ]
    )
    print(body)
    if not args.no_write:
        write_section("gateway", body)


if __name__ == "__main__":
    main()

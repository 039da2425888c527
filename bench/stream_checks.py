"""Output checks on a streamed answer: per token (the old way) against per chunk.

One 128-token answer, split into the deltas SmolLM2's tokenizer gives, goes through the
default policy's output checks (prompt leaks, secrets, PII) twice in the same run:

- per token: the `StreamingRedactor` as it was before chunking, reimplemented here as the
  baseline: every delta goes through `asyncio.to_thread` and re-redacts the held window;
- per chunk: `guardrails.streaming.StreamingRedactor` as the gateway drives it
  (`OutputGuardrails.streaming`): deltas are held on the event loop, the first words go out
  once no check can still need them, and then a check goes to a thread once `chunk_chars`
  new characters came in.

Both are timed the way `ChatService.stream_text` runs them (an asyncio loop, thread hops
included) and without the loop; each run's output is checked against the whole-answer
redaction. Reported: median ms per answer, the ratio, redact calls per answer, and how
many tokens go by before the first text is released.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import yaml
from transformers import AutoTokenizer

# The repository first: bench/engine.py would shadow the `engine` package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from doc_section import write_section

from engine import default_model_source
from gateway.policy.schema import Policy
from guardrails import LeakDetector, OutputGuardrails, PiiRedactor, SecretsFilter, build_analyzer
from guardrails.streaming import DEFAULT_CHUNK_CHARS, StreamingRedactor

WAYS = ("per token", "per chunk")
REPO = Path(__file__).resolve().parent.parent
COMMAND = "flock /tmp/bench.lock .venv/bin/python bench/stream_checks.py"
ANSWER = (
    "The wing's lift grows with the square of the airspeed and with the angle of attack, "
    "up to the stall [1]. At low Reynolds numbers the boundary layer separates earlier, so "
    "the maximum lift coefficient drops and the stall comes at a smaller angle [2]. Flaps "
    "raise the camber and let the wing fly slower at the same lift. For the test data, "
    "write to the lab at wind.tunnel@example.com or call 555 123 4567; the runs in the "
    "report were made at a Mach number of 0.2 with a chord of 30 cm. Drag rises sharply "
    "past the stall, which is why the polar bends over [1]. A thicker section delays "
    "separation on the upper surface and gives a gentler stall, at the cost of a little "
    "more drag at cruise, and a rougher surface moves transition forward on the wing."
)


class Redactor(Protocol):
    def feed(self, delta: str) -> str: ...
    def flush(self) -> str: ...


class PerTokenRedactor:
    """The baseline: the streaming redactor before chunking, as it was in
    guardrails/streaming.py (each feed redacts the held window and up to 3 cuts)."""

    def __init__(self, redact: Callable[[str], str], window_chars: int) -> None:
        self._redact = redact
        self._window = window_chars
        self._pending = ""
        self._last_tried = 0

    def feed(self, delta: str) -> str:
        self._pending += delta
        complete = _after_last_space(self._pending)
        cuts = _cuts_before(self._pending, complete - self._window)
        if not cuts or cuts[0] <= self._last_tried:
            return ""
        full = self._redact(self._pending[:complete])
        for cut in cuts[:3]:
            released = self._redact(self._pending[:cut])
            if full.startswith(released):
                self._pending = self._pending[cut:]
                self._last_tried = 0
                return released
        self._last_tried = cuts[0]
        return ""

    def flush(self) -> str:
        rest, self._pending, self._last_tried = self._pending, "", 0
        return self._redact(rest) if rest else ""


def _after_last_space(text: str) -> int:
    for i in range(len(text) - 1, -1, -1):
        if text[i].isspace():
            return i + 1
    return 0


def _cuts_before(text: str, limit: int) -> list[int]:
    return [
        i + 1
        for i in range(min(limit, len(text)) - 1, -1, -1)
        if text[i].isspace() and (i + 1 == len(text) or not text[i + 1].isspace())
    ]


@dataclass
class Run:
    ms: float
    calls: int
    first_delta: int  # deltas fed before the first text came out
    first_ms: float  # ms from the first delta to the first released text
    text: str


class Counted:
    """A redact function that counts its calls."""

    def __init__(self, redact: Callable[[str], str]) -> None:
        self.redact = redact
        self.calls = 0

    def __call__(self, text: str) -> str:
        self.calls += 1
        return self.redact(text)


def output_checks() -> tuple[OutputGuardrails, int]:
    """The default policy's output checks and stream window, built as the gateway does."""
    policy = Policy.model_validate(yaml.safe_load((REPO / "policies/default.yaml").read_text()))
    answers = policy.output
    output = OutputGuardrails(
        PiiRedactor(build_analyzer(tuple(answers.pii.countries)), answers.pii),
        SecretsFilter(answers.secrets),
        LeakDetector(answers.leaks, policy.model.system_prompt),
    )
    return output, answers.stream_window_chars


def token_deltas(text: str, tokens: int) -> list[str]:
    """The text deltas the engine's detokenizer would stream for `text`'s first tokens."""
    source = default_model_source()
    tokenizer = AutoTokenizer.from_pretrained(str(source.folder), gguf_file=source.gguf_file)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:tokens]
    decoded = [tokenizer.decode(ids[:i]) for i in range(len(ids) + 1)]
    return [b[len(a) :] for a, b in itertools.pairwise(decoded)]


class Released:
    """What a run released, and when the first text came out."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.parts: list[str] = []
        self.first_delta = -1
        self.first_ms = 0.0

    def add(self, index: int, text: str) -> None:
        if text and self.first_delta < 0:
            self.first_delta, self.first_ms = index, (time.perf_counter() - self.started) * 1000
        self.parts.append(text)


async def per_token_async(redactor: PerTokenRedactor, deltas: list[str], out: Released) -> None:
    """The old `stream_text` loop: one thread hop per delta."""
    for i, delta in enumerate(deltas):
        out.add(i, await asyncio.to_thread(redactor.feed, delta))
    out.add(len(deltas), await asyncio.to_thread(redactor.flush))


async def per_chunk_async(redactor: StreamingRedactor, deltas: list[str], out: Released) -> None:
    """The new `stream_text` loop: a thread hop only when a check is due."""
    for i, delta in enumerate(deltas):
        if redactor.add(delta):
            out.add(i, await asyncio.to_thread(redactor.release))
    out.add(len(deltas), await asyncio.to_thread(redactor.flush))


def inline(redactor: Redactor, deltas: list[str], out: Released) -> None:
    for i, delta in enumerate(deltas):
        out.add(i, redactor.feed(delta))
    out.add(len(deltas), redactor.flush())


async def measure(
    output: OutputGuardrails, window: int, deltas: list[str], way: str, threaded: bool
) -> Run:
    redact = Counted(output.redactor())
    out = Released()
    if way == "per token":
        old = PerTokenRedactor(redact, window)
        await per_token_async(old, deltas, out) if threaded else inline(old, deltas, out)
    else:
        new = StreamingRedactor(redact, window, hold=output.hold_from)
        await per_chunk_async(new, deltas, out) if threaded else inline(new, deltas, out)
    ms = (time.perf_counter() - out.started) * 1000
    return Run(ms, redact.calls, out.first_delta, out.first_ms, "".join(out.parts))


async def compare(
    output: OutputGuardrails, window: int, deltas: list[str], runs: int, whole: str
) -> list[tuple[bool, dict[str, list[Run]]]]:
    """Both ways, interleaved, in one event loop (one thread pool, as in the gateway)."""
    rows = []
    for threaded in (True, False):
        by_way: dict[str, list[Run]] = {way: [] for way in WAYS}
        for i in range(runs + 3):
            for way in WAYS:
                run = await measure(output, window, deltas, way, threaded)
                assert run.text == whole, (way, run.text)
                if i >= 3:  # the first runs warm the analyzer and the thread pool
                    by_way[way].append(run)
        rows.append((threaded, by_way))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40, help="runs of each way (interleaved)")
    parser.add_argument("--no-write", action="store_true", help="do not touch the docs")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    output, window = output_checks()
    deltas = token_deltas(ANSWER, 128)
    answer = "".join(deltas)
    whole = output.redactor()(answer)
    assert "wind.tunnel@example.com" in answer and "555 123 4567" in answer, answer
    assert "wind.tunnel" not in whole and "4567" not in whole, whole
    rows = asyncio.run(compare(output, window, deltas, args.runs, whole))
    section = render(rows, len(deltas), len(answer), window, args.runs, load_before)
    print(section)
    if not args.no_write:
        write_section("stream_checks", section)
        print("wrote the stream_checks section of docs/benchmarks.md")


def render(
    rows: list[tuple[bool, dict[str, list[Run]]]],
    tokens: int,
    chars: int,
    window: int,
    runs: int,
    load: float,
) -> str:
    lines = [
        "## Output checks on a streamed answer",
        "",
        f"Command: `{COMMAND}`. One answer of {tokens} tokens ({chars} characters, with an "
        "email address and a phone number), split into the deltas SmolLM2's tokenizer "
        "gives, through the default policy's output checks (prompt leaks, secrets, PII; "
        f"stream window {window} characters), {runs} runs of each way, interleaved, in "
        f"one process (load average {load:.1f} at the start). Per token: the streaming "
        "redactor before chunking (reimplemented in the bench as the baseline), one "
        "`asyncio.to_thread` hop and a redaction of the held window per delta. Per chunk: "
        "`StreamingRedactor` as the gateway runs it: the first words released once no check "
        "can still need them (`OutputGuardrails.hold_from`), then a check every "
        f"{DEFAULT_CHUNK_CHARS} new characters (at a word's end), a thread hop only for a "
        "due check. Both give exactly the whole-answer redaction.",
        "",
        "| Loop | Per token: ms per answer | Per chunk: ms per answer | Ratio | "
        "Redact calls (token / chunk) | Deltas before the first release (token / chunk) "
        "| ms to the first release, deltas back to back (token / chunk) |",
        "|---|---|---|---|---|---|---|",
    ]
    for threaded, by_way in rows:
        old, new = by_way["per token"], by_way["per chunk"]
        old_ms = statistics.median(r.ms for r in old)
        new_ms = statistics.median(r.ms for r in new)
        loop = "asyncio, thread hops (as `stream_text`)" if threaded else "inline, no loop"
        lines.append(
            f"| {loop} | {old_ms:.2f} | {new_ms:.2f} | {old_ms / new_ms:.1f}x | "
            f"{old[0].calls} / {new[0].calls} | "
            f"{old[0].first_delta} / {new[0].first_delta} | "
            f"{statistics.median(r.first_ms for r in old):.2f} / "
            f"{statistics.median(r.first_ms for r in new):.2f} |"
        )
    old_ms = statistics.median(r.ms for r in rows[0][1]["per token"])
    new_ms = statistics.median(r.ms for r in rows[0][1]["per chunk"])
    lines += [
        "",
        f"Through the asyncio loop, chunking saves {old_ms - new_ms:.0f} ms of the gateway's "
        f"time per {tokens}-token answer ({(old_ms - new_ms) / tokens:.2f} ms a token); "
        "the first text goes out as soon as its first word has ended and no check can "
        "still need it, where the per-token way waits for the window.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()

"""The input pipeline: injection, then PII actions, then the topic allow- and deny-lists."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from guardrails.injection import CHECK_NAME as INJECTION
from guardrails.injection import InjectionDetector
from guardrails.pii import CHECK_NAME as PII
from guardrails.pii import PiiCheck, PiiRedactor
from guardrails.topics import CHECK_NAME as TOPIC
from guardrails.topics import TopicMatcher
from guardrails.verdict import Verdict

T = TypeVar("T")


class CheckTrace(Protocol):
    """Runs one named check, e.g. inside a tracing span (the gateway's `trace_check`)."""

    def __call__(self, check: str, run: Callable[[], T]) -> T: ...


def timed(
    timings: dict[str, float] | None,
    check: str,
    run: Callable[[], T],
    trace: CheckTrace | None = None,
) -> T:
    """`run()`, its wall time in ms recorded under `check` when `timings` is given (the
    check endpoint reports each stage's latency of the very call the chat path makes),
    run through `trace` when given."""
    started = time.perf_counter()
    try:
        return run() if trace is None else trace(check, run)
    finally:
        if timings is not None:
            timings[check] = (time.perf_counter() - started) * 1000


@dataclass(slots=True)
class InputCheckResult:
    """Texts to forward, every verdict in order, the first blocking one, the
    placeholder -> original map of the redaction, and the part of it the answer may have
    restored (pseudonymised entities; pass it to `OutputGuardrails`)."""

    texts: list[str]
    verdicts: list[Verdict]
    blocking: Verdict | None
    placeholders: dict[str, str]
    restorable: dict[str, str] = field(default_factory=dict)


class InputGuardrails:
    """Runs the input checks in order and stops at the first blocking verdict."""

    def __init__(
        self, injection: InjectionDetector, pii: PiiRedactor, topics: TopicMatcher | None
    ) -> None:
        self._injection = injection
        self._pii = pii
        self._topics = topics

    def redact(self, texts: Sequence[str]) -> PiiCheck:
        """The PII stage alone: the texts as the policy forwards them, and its verdict."""
        return self._pii.check_detailed(texts)

    def check(
        self,
        texts: Sequence[str],
        topic_text: str,
        roles: Sequence[str] | None = None,
        timings: dict[str, float] | None = None,
        pii: PiiCheck | None = None,
        trace: CheckTrace | None = None,
    ) -> InputCheckResult:
        """Check a request's texts (every message, system and tool ones included; `roles`
        labels them in the evidence). `topic_text` (the last user message) is
        topic-checked unredacted, as the injection check read it, so a caching embedder
        serves both checks with one model pass (`topics.topic_text`; the injection check
        embeds it along with its own texts when it embeds any); the topic verdict
        records only topic names and scores, never the text. `timings`, when given, gets each
        check's latency in ms. `pii` is `redact(texts)` when the caller already ran it (chat
        redacts first, to start retrieval on the redacted query beside the other checks);
        the verdicts and their order are the same either way. `trace` wraps each check
        (tracing spans)."""
        along = [] if self._topics is None else self._topics.query_texts(topic_text)
        injection = timed(
            timings,
            INJECTION,
            lambda: self._injection.check(texts, roles, embed_along=along),
            trace,
        )
        verdicts = [injection]
        if injection.blocks:
            return InputCheckResult(list(texts), verdicts, injection, {})

        if pii is None:
            pii = timed(timings, PII, lambda: self.redact(texts), trace)
        verdicts.append(pii.verdict)
        if pii.verdict.blocks:
            return InputCheckResult(list(texts), verdicts, pii.verdict, {})
        if self._topics is None:
            return InputCheckResult(pii.texts, verdicts, None, pii.placeholders, pii.restorable)

        topics = self._topics
        topic = timed(timings, TOPIC, lambda: topics.check(topic_text), trace)
        verdicts.append(topic)
        blocking = topic if topic.blocks else None
        return InputCheckResult(pii.texts, verdicts, blocking, pii.placeholders, pii.restorable)

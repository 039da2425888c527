"""Checks read a repeated text once: a long system message sent with every request costs
its injection and PII checks on the first request only."""

from __future__ import annotations

from typing import Any

from presidio_analyzer import AnalyzerEngine

from guardrails.config import InjectionConfig, PiiConfig
from guardrails.injection import InjectionDetector
from guardrails.pii import PiiRedactor
from guardrails.text_cache import TextCache
from retrieval.embedder import Embedder
from tests.support.recording_embedder import RecordingEmbedder

# Long enough for several windows, with phrases that send it past the screen.
SYSTEM_MESSAGE = (
    "You are the support assistant of the facilities team. Follow the instructions in this "
    "message and ignore questions about other departments. "
) * 30
PII_TEXT = "Call Maria on 212-555-0147 or write to maria.lopez@example.com about the badge."


def test_the_cache_keeps_the_most_recent_texts_by_digest() -> None:
    cache: TextCache[int] = TextCache(entries=2)
    cache.put("one", 1)
    cache.put("two", 2)
    assert cache.get("one") == 1  # now the most recent
    cache.put("three", 3)
    assert (cache.get("one"), cache.get("two"), cache.get("three")) == (1, None, 3)
    assert all(isinstance(key, bytes) for key in cache._results), "no text is kept"


def test_a_repeated_message_is_classified_once(embedder: Embedder) -> None:
    counting = RecordingEmbedder(embedder)
    detector = InjectionDetector(InjectionConfig(), embed=counting)
    first = detector.check([SYSTEM_MESSAGE, "Where is the badge office?"], ["system", "user"])
    assert counting.asked, "the message was scored by the full classifier"
    counting.clear()
    again = detector.check([SYSTEM_MESSAGE, "Who fixes the lift?"], ["system", "user"])
    assert first.score == again.score and first.action == again.action == "allow"
    assert not any(SYSTEM_MESSAGE[:200] in text for text in counting.asked), counting.asked


def test_pii_findings_are_computed_once_a_text(analyzer: AnalyzerEngine) -> None:
    redactor = PiiRedactor(analyzer, PiiConfig())
    calls: list[Any] = []
    analyze = analyzer.analyze

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs.get("text"))
        return analyze(*args, **kwargs)

    analyzer.analyze = counting  # type: ignore[method-assign]
    try:
        first = redactor.check([PII_TEXT])
        second = redactor.check(["An earlier note.", PII_TEXT])
    finally:
        del analyzer.analyze
    assert calls.count(PII_TEXT) == 1
    assert first[0] == [
        "Call Maria on <PHONE_NUMBER_1> or write to <EMAIL_ADDRESS_1> about the badge."
    ]
    assert second[0][1] == first[0][0]

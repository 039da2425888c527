from __future__ import annotations

import numpy as np
import pytest

from guardrails.config import Topic, TopicConfig
from guardrails.embedding import EMBED_CHARS
from guardrails.normalize import normalize
from guardrails.topics import Embedder, TopicMatcher, topic_anchors, topic_text

TOPICS = [
    Topic(
        name="it-support",
        description="IT support: passwords, VPN access, laptops, email and software installs",
        examples=["How do I reset my password?", "The VPN won't connect from home"],
    ),
    Topic(
        name="hr",
        description="Human resources: vacation days, payroll, benefits and parental leave",
        examples=["How many vacation days do I have left?"],
    ),
]


@pytest.fixture(scope="module")
def matcher(embedder: Embedder) -> TopicMatcher:
    return TopicMatcher(embedder, TopicConfig(enabled=True, allowed=TOPICS))


def test_embedder_rows_are_normalised(embedder: Embedder) -> None:
    vectors = embedder(["hello", "world"])
    assert vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)


def test_on_topic_question_is_allowed(matcher: TopicMatcher) -> None:
    verdict = matcher.check("My laptop cannot connect to the VPN, what should I do?")
    assert verdict.action == "allow"
    assert verdict.evidence == ("it-support",)
    assert verdict.score >= 0.25


def test_closest_topic_is_named(matcher: TopicMatcher) -> None:
    verdict = matcher.check("When is payroll processed this month?")
    assert verdict.action == "allow"
    assert verdict.evidence == ("hr",)


def test_off_topic_request_is_blocked(matcher: TopicMatcher) -> None:
    verdict = matcher.check("Write a sonnet about pirates sailing to the moon")
    assert verdict.action == "block"
    assert verdict.check == "topic"
    assert verdict.evidence[0].startswith("off-topic; closest: ")
    assert verdict.score < 0.25


def test_disabled_or_empty_allows(embedder: Embedder) -> None:
    disabled = TopicMatcher(embedder, TopicConfig(enabled=False, allowed=TOPICS))
    assert disabled.check("Write a sonnet about pirates").action == "allow"
    empty = TopicMatcher(embedder, TopicConfig(enabled=True))
    assert empty.check("Write a sonnet about pirates").action == "allow"


def test_threshold_out_of_range_is_rejected() -> None:
    with pytest.raises(ValueError):
        TopicConfig(threshold=1.5)


DENIED = [
    Topic(
        name="legal-advice",
        description="Legal advice: lawsuits, suing someone, contracts disputes and court cases",
        examples=["Can I sue my landlord?", "How do I win a court case against my employer?"],
    )
]


def test_denied_topic_blocks_even_without_allow_list(embedder: Embedder) -> None:
    matcher = TopicMatcher(embedder, TopicConfig(enabled=True, denied=DENIED, deny_threshold=0.45))
    verdict = matcher.check("Should I sue my landlord over the deposit?")
    assert verdict.action == "block"
    assert "denied topic legal-advice" in verdict.evidence[0]
    assert matcher.check("How do I reset my VPN password?").action == "allow"


def test_deny_list_wins_over_allow_list(embedder: Embedder) -> None:
    config = TopicConfig(enabled=True, allowed=TOPICS, denied=DENIED, deny_threshold=0.45)
    matcher = TopicMatcher(embedder, config)
    assert matcher.check("Can I sue my employer for unpaid vacation days?").action == "block"
    assert matcher.check("How many vacation days do I have left this year?").action == "allow"


def test_topic_error_fails_closed() -> None:
    def broken(texts: list[str]) -> np.ndarray:
        if texts == ["boom"]:
            raise RuntimeError("embedder down")
        return np.ones((len(texts), 4), dtype=np.float32) / 2

    matcher = TopicMatcher(broken, TopicConfig(enabled=True, allowed=TOPICS))
    verdict = matcher.check("boom")
    assert verdict.blocks
    assert "embedder down" in verdict.evidence[0]


def test_anchors_list_each_item_of_the_description() -> None:
    anchors = topic_anchors(TOPICS[0])
    assert anchors[0] == TOPICS[0].description
    assert "IT support: laptops" in anchors and "IT support: software installs" in anchors
    assert anchors[-2:] == TOPICS[0].examples
    plain = Topic(name="x", description="Cooking recipes")
    assert topic_anchors(plain) == ["Cooking recipes"]


@pytest.mark.parametrize(
    "text",
    ["The printer on floor 3 is jammed again", "My laptop won't turn on after the update"],
)
def test_short_request_about_a_listed_item_is_allowed_at_the_default(
    embedder: Embedder, text: str
) -> None:
    printers = Topic(
        name="it-support",
        description="IT support: passwords, VPN, laptops, email, printers and software installs",
        examples=["How do I reset my password?"],
    )
    matcher = TopicMatcher(embedder, TopicConfig(enabled=True, allowed=[printers]))
    assert matcher.check(text).action == "allow"
    assert matcher.check("Write me a poem about the ocean").action == "block"


def test_topic_text_is_the_normalised_start_of_a_long_text() -> None:
    short = "My  laptop\u200b will not boot"
    assert topic_text(short) == normalize(short)
    long = "The printer on floor three is jammed again and nobody can print. " * 20
    cut = topic_text(long)
    assert EMBED_CHARS // 2 < len(cut) <= EMBED_CHARS
    assert normalize(long).startswith(cut) and not cut.endswith(" ")

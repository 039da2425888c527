"""Topic allow-list and deny-list by embedding similarity to topics the policy describes."""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from guardrails.config import Topic, TopicConfig
from guardrails.embedding import Embedder, embedding_head
from guardrails.normalize import normalize
from guardrails.verdict import Verdict, failed_check

CHECK_NAME = "topic"

_LIST_SEPARATOR = re.compile(r",|;|\band\b|\bor\b")


def topic_text(text: str) -> str:
    """What the topic check embeds: the head of the normalised text (`embedding_head`),
    which is what the injection classifier embeds for the text's first window."""
    return embedding_head(normalize(text))


def topic_anchors(topic: Topic) -> list[str]:
    """The texts a topic is matched against: its description, each item the description
    lists ("IT support: passwords, VPN" gives "IT support: passwords" and "IT support:
    VPN"), and its examples. A short request ("the printer is jammed") sits much closer to
    one item than to the whole list."""
    head, colon, body = topic.description.partition(":")
    if not colon:
        head, body = "", topic.description
    items = [item.strip() for item in _LIST_SEPARATOR.split(body) if item.strip()]
    prefix = f"{head.strip()}: " if head.strip() else ""
    listed = [prefix + item for item in items] if len(items) > 1 else []
    return list(dict.fromkeys([topic.description, *listed, *topic.examples]))


class _TopicIndex:
    """Embedded anchors (`topic_anchors`) of some topics; a text's score per topic is its
    best cosine similarity to any of that topic's anchors."""

    def __init__(self, embed: Embedder, topics: Sequence[Topic]) -> None:
        self.topics = list(topics)
        self._owners: list[int] = []
        texts: list[str] = []
        for i, topic in enumerate(self.topics):
            for text in topic_anchors(topic):
                texts.append(text)
                self._owners.append(i)
        self._vectors = np.asarray(embed(texts), dtype=np.float32) if texts else None

    def closest(self, query: npt.NDArray[np.float32]) -> tuple[str, float] | None:
        if self._vectors is None:
            return None
        similarities = self._vectors @ query
        best = int(np.argmax(similarities))
        return self.topics[self._owners[best]].name, float(similarities[best])


class TopicMatcher:
    """Blocks a text close to a denied topic, or far from every allowed topic (when an
    allow-list is configured).

    Only the start of a long text counts (`topic_text`).
    """

    def __init__(self, embed: Embedder, config: TopicConfig) -> None:
        self._embed = embed
        self._config = config
        self._allowed = _TopicIndex(embed, config.allowed if config.enabled else [])
        self._denied = _TopicIndex(embed, config.denied if config.enabled else [])

    def query_texts(self, text: str) -> list[str]:
        """What `check(text)` embeds: [] when the check is off or lists no topics."""
        config = self._config
        return [topic_text(text)] if config.enabled and (config.allowed or config.denied) else []

    def check(self, text: str) -> Verdict:
        mode = self._config.mode
        if not self._config.enabled:
            return Verdict(CHECK_NAME, "allow", 0.0, ("disabled",), mode)
        if not self._config.allowed and not self._config.denied:
            return Verdict(CHECK_NAME, "allow", 0.0, ("no topics configured",), mode)
        try:
            return self._check(text)
        except Exception as exc:  # any failure must fail closed, not crash
            return failed_check(CHECK_NAME, mode, self._config.fail_closed, exc)

    def _check(self, text: str) -> Verdict:
        mode = self._config.mode
        query = np.asarray(self._embed(self.query_texts(text)), dtype=np.float32)[0]
        denied = self._denied.closest(query)
        if denied is not None and denied[1] >= self._config.deny_threshold:
            name, score = denied
            evidence = (f"denied topic {name} (similarity {score:.2f})",)
            return Verdict(CHECK_NAME, "block", score, evidence, mode)
        allowed = self._allowed.closest(query)
        if allowed is None:
            closest = f"; closest denied: {denied[0]} ({denied[1]:.2f})" if denied else ""
            return Verdict(CHECK_NAME, "allow", 0.0, (f"no denied topic matched{closest}",), mode)
        name, score = allowed
        if score >= self._config.threshold:
            return Verdict(CHECK_NAME, "allow", score, (name,), mode)
        evidence = (f"off-topic; closest: {name} (similarity {score:.2f})",)
        return Verdict(CHECK_NAME, "block", score, evidence, mode)

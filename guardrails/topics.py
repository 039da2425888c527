"""Topic allow-list and deny-list by embedding similarity to topics the policy describes."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from guardrails.config import Topic, TopicConfig
from guardrails.verdict import Verdict, failed_check

CHECK_NAME = "topic"

# Takes texts, returns one L2-normalised float32 row per text.
Embedder = Callable[[list[str]], npt.NDArray[np.float32]]


class _TopicIndex:
    """Embedded descriptions and examples of some topics; a text's score per topic is its
    best cosine similarity to any of that topic's rows."""

    def __init__(self, embed: Embedder, topics: Sequence[Topic]) -> None:
        self.topics = list(topics)
        self._owners: list[int] = []
        texts: list[str] = []
        for i, topic in enumerate(self.topics):
            for text in (topic.description, *topic.examples):
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
    allow-list is configured)."""

    def __init__(self, embed: Embedder, config: TopicConfig) -> None:
        self._embed = embed
        self._config = config
        self._allowed = _TopicIndex(embed, config.allowed if config.enabled else [])
        self._denied = _TopicIndex(embed, config.denied if config.enabled else [])

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
        query = np.asarray(self._embed([text]), dtype=np.float32)[0]
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

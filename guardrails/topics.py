"""Topic allow-list: a request must be semantically close to one of the allowed topics."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from guardrails.config import TopicConfig
from guardrails.verdict import Verdict

CHECK_NAME = "topic"

# Takes texts, returns one L2-normalised float32 row per text.
Embedder = Callable[[list[str]], npt.NDArray[np.float32]]


class TopicMatcher:
    """Scores a text by its best cosine similarity to any allowed topic's description or
    examples; below the threshold it is off-topic."""

    def __init__(self, embed: Embedder, config: TopicConfig) -> None:
        self._embed = embed
        self._config = config
        self._owners: list[int] = []  # topic index of each row of self._vectors
        texts: list[str] = []
        if config.enabled:
            for i, topic in enumerate(config.allowed):
                for text in (topic.description, *topic.examples):
                    texts.append(text)
                    self._owners.append(i)
        self._vectors = np.asarray(embed(texts), dtype=np.float32) if texts else None

    def check(self, text: str) -> Verdict:
        mode = self._config.mode
        if not self._config.enabled:
            return Verdict(CHECK_NAME, "allow", 0.0, ("disabled",), mode)
        if self._vectors is None:
            return Verdict(CHECK_NAME, "allow", 0.0, ("no allowed topics configured",), mode)
        query = np.asarray(self._embed([text]), dtype=np.float32)[0]
        similarities = self._vectors @ query
        best = int(np.argmax(similarities))
        score = float(similarities[best])
        name = self._config.allowed[self._owners[best]].name
        if score >= self._config.threshold:
            return Verdict(CHECK_NAME, "allow", score, (name,), mode)
        return Verdict(CHECK_NAME, "block", score, (f"off-topic; closest: {name}",), mode)

"""What the guardrails embed: the embedder they are given and the part of a text it reads."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

# Takes texts, returns one L2-normalised float32 row per text.
Embedder = Callable[[list[str]], npt.NDArray[np.float32]]


class TokenEmbedder(Protocol):
    """An embedder that also gives each text's token vectors from the same model pass
    (retrieval's MiniLM): the injection classifier's token head reads them."""

    def __call__(self, texts: list[str]) -> npt.NDArray[np.float32]: ...

    def embed_with_tokens(
        self, texts: Sequence[str]
    ) -> tuple[npt.NDArray[np.float32], list[npt.NDArray[np.float32]]]: ...


# The topic check and the injection classifier both embed this head of a text, so for a
# request of one window they ask for the same text and a caching embedder runs the model
# once for both. About 70 word pieces: MiniLM's cost grows with the length (16 ms here
# against 23 for 500 characters and 41 for 1,000, bf16 on one thread), while the
# classifier's cross-validated recall was the same with heads of 300, 400 and 500
# characters (its n-grams read the whole window). A request's topic is read from its
# first two or three sentences.
EMBED_CHARS = 300


def embedding_head(text: str) -> str:
    """`text` cut at a space near EMBED_CHARS (whole when shorter)."""
    if len(text) <= EMBED_CHARS:
        return text
    space = text.rfind(" ", EMBED_CHARS // 2, EMBED_CHARS)
    return text[: space if space > 0 else EMBED_CHARS]

"""BM25 over one (tenant, collection)'s chunks, built from the database when it changes."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import bm25s
import numpy as np
from bm25s.stopwords import STOPWORDS_EN

_WORD = re.compile(r"[^\W_]+(?:[-'.][^\W_]+)*")
_STOPWORDS = frozenset(STOPWORDS_EN)
# Longest first; each entry is (suffix, what replaces it, shortest stem kept).
_SUFFIXES = (
    ("ational", "ate", 3),
    ("ization", "ize", 3),
    ("ations", "ate", 3),
    ("ation", "ate", 3),
    ("ness", "", 3),
    ("ments", "", 3),
    ("ment", "", 3),
    ("ities", "ity", 3),
    ("ies", "y", 3),
    ("ing", "", 3),
    ("ed", "", 3),
    ("es", "", 4),
    ("s", "", 3),
)


def tokenize(text: str) -> list[str]:
    """Lower-cased words without stop words, lightly stemmed.

    Identifiers with inner punctuation ("err-4711", "v2.3") are kept whole and also split,
    so that an exact code matches and so do its parts.
    """
    tokens: list[str] = []
    for match in _WORD.finditer(text.lower()):
        word = match.group()
        if word in _STOPWORDS:
            continue
        tokens.append(_stem(word))
        if not word.isalnum():
            tokens.extend(_stem(p) for p in re.split(r"[-'.]", word) if p not in _STOPWORDS)
    return tokens


def _stem(word: str) -> str:
    if not word.isalpha():
        return word
    for suffix, replacement, shortest in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= shortest:
            if suffix == "s" and word.endswith(("ss", "us", "is")):
                return word
            return word[: -len(suffix)] + replacement
    return word


class LexicalIndex:
    """An immutable BM25 index of some chunks; `fingerprint` says which state it reflects."""

    def __init__(self, ids: Sequence[int], texts: Sequence[str], fingerprint: object) -> None:
        self.fingerprint = fingerprint
        self._ids = np.asarray(ids, dtype=np.int64)
        self._position = {int(chunk_id): i for i, chunk_id in enumerate(self._ids)}
        self._bm25: bm25s.BM25 | None = None
        self._terms = [tokenize(text) for text in texts]
        if any(self._terms):
            self._bm25 = bm25s.BM25()
            self._bm25.index(self._terms, show_progress=False)
        frequency = Counter(term for terms in self._terms for term in set(terms))
        total = len(self._terms)
        self._idf = {t: math.log(1 + (total - n + 0.5) / (n + 0.5)) for t, n in frequency.items()}

    @property
    def size(self) -> int:
        return len(self._ids)

    def expansion_terms(
        self, query: str, ids: Sequence[int], count: int
    ) -> list[tuple[str, float]]:
        """The `count` terms that most of the chunks `ids` share, weighted by rarity, and that
        the query lacks: pseudo-relevance feedback, as in RM3, from the best first hits."""
        asked = set(tokenize(query))
        weights: dict[str, float] = {}
        for chunk_id in ids:
            position = self._position.get(chunk_id)
            if position is not None:
                for term in set(self._terms[position]) - asked:
                    weights[term] = weights.get(term, 0.0) + self._idf[term]
        best = sorted(weights, key=lambda term: (-weights[term], term))[:count]
        return [(term, weights[term]) for term in best]

    def search(
        self,
        query: str,
        k: int,
        allowed: set[int] | None = None,
        expansion: Sequence[str] = (),
        expansion_weight: float = 0.5,
    ) -> list[tuple[int, float]]:
        """The ids and BM25 scores of the `k` best chunks (only `allowed` ones, if given).

        `expansion` terms add their BM25 scores times `expansion_weight`.
        """
        if self._bm25 is None or k <= 0:
            return []
        vocabulary = self._bm25.vocab_dict
        tokens = [t for t in tokenize(query) if t in vocabulary]
        extra = [t for t in expansion if t in vocabulary]
        if not tokens and not extra:
            return []
        scores = self._bm25.get_scores(tokens) if tokens else np.zeros(len(self._ids))
        if extra:
            scores = scores + expansion_weight * self._bm25.get_scores(extra)
        if allowed is not None:
            mask = np.zeros(len(scores), dtype=bool)
            mask[[self._position[i] for i in allowed if i in self._position]] = True
            scores = np.where(mask, scores, 0.0)
        candidates = np.flatnonzero(scores > 0)
        if len(candidates) > k:
            candidates = candidates[np.argpartition(-scores[candidates], k - 1)[:k]]
        order = candidates[np.argsort(-scores[candidates], kind="stable")]
        return [(int(self._ids[i]), float(scores[i])) for i in order]

"""Incremental detokenization that never emits half a character or half a stop string."""

from __future__ import annotations

from collections.abc import Callable, Sequence


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    Decoding the whole completion each time is cheap at chat lengths and is the only
    way to get spacing right for SentencePiece/BPE merges. Text that ends in U+FFFD (an
    incomplete UTF-8 sequence) or that could be the start of a stop string is held back.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str]) -> None:
        self._decode = decode
        self._stop = tuple(s for s in stop if s)
        self._ids: list[int] = []
        self._emitted = 0
        self.stopped = False

    def add(self, token_id: int) -> str:
        """Append a token; return the text that is now safe to release."""
        self._ids.append(token_id)
        text = self._decode(self._ids)
        for stop in self._stop:
            at = text.find(stop)
            if at != -1:
                self.stopped = True
                return self._release(text[:at])
        if text.endswith("\ufffd"):
            return ""
        return self._release(text[: len(text) - self._held_back(text)])

    def flush(self) -> str:
        """Release what was held back once generation ended without a stop string."""
        if self.stopped:
            return ""
        return self._release(self._decode(self._ids).rstrip("\ufffd"))

    def _held_back(self, text: str) -> int:
        longest = 0
        for stop in self._stop:
            for size in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:size]):
                    longest = max(longest, size)
                    break
        return longest

    def _release(self, text: str) -> str:
        delta = text[self._emitted :]
        self._emitted = max(self._emitted, len(text))
        return delta

"""Incremental detokenization that never emits half a character or half a stop string."""

from __future__ import annotations

from collections.abc import Callable, Sequence


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    Each token decodes a short window, not the whole completion: the tokens since the last
    complete text and the few before them (`_prefix_at`). The window keeps what a token's
    text depends on (SentencePiece's word-start spaces, BPE's byte merges), and its
    decoded text minus that of its older part is the new text, as vLLM and TGI do it: the
    cost per token stays flat however long the answer grows. Text that ends in U+FFFD (an
    incomplete UTF-8 sequence) or that could be the start of a stop string is held back.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str]) -> None:
        self._decode = decode
        self._stop = tuple(s for s in stop if s)
        self._ids: list[int] = []
        self._prefix_at = 0  # the window's first token
        self._read_at = 0  # the tokens before this one are in `_text`
        self._text = ""
        self._emitted = 0
        self.stopped = False

    def add(self, token_id: int) -> str:
        """Append a token; return the text that is now safe to release."""
        self._ids.append(token_id)
        new_text = self._new_text()
        if new_text is None:
            return ""
        searched_to = len(self._text)
        self._text += new_text
        for stop in self._stop:
            at = self._text.find(stop, max(searched_to - len(stop) + 1, 0))
            if at != -1:
                self.stopped = True
                return self._release(self._text[:at])
        return self._release(self._text[: len(self._text) - self._held_back(self._text)])

    def flush(self) -> str:
        """Release what was held back once generation ended without a stop string."""
        if self.stopped:
            return ""
        older = self._decode(self._ids[self._prefix_at : self._read_at])
        tail = self._decode(self._ids[self._prefix_at :])[len(older) :]
        self._text += tail.rstrip("\ufffd")
        self._prefix_at = self._read_at = len(self._ids)
        return self._release(self._text)

    def _new_text(self) -> str | None:
        """The text the tokens since `_read_at` add, once it ends on a whole character."""
        older = self._decode(self._ids[self._prefix_at : self._read_at])
        window = self._decode(self._ids[self._prefix_at :])
        if len(window) <= len(older) or window.endswith("\ufffd"):
            return None
        self._prefix_at, self._read_at = self._read_at, len(self._ids)
        return window[len(older) :]

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

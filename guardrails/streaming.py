"""Redaction of a streamed answer: hold back a window so no entity is released in pieces.

The redact function is normally `OutputGuardrails.redactor(...)`, which composes the
output checks (prompt leaks, secrets, PII, restoring pseudonyms), so streaming applies
every one of them.

A cut is taken only where redacting the text before it gives exactly the start of the
redaction of all pending text, so an entity spanning the cut (e.g. "555 123 4567") keeps
the text held until it is whole. The window must exceed the longest entity (about 40
characters for an IBAN) for this to be reliable.
"""

from __future__ import annotations

from collections.abc import Callable

# Candidate cuts tried per release; each costs one `redact` call.
_MAX_TRIALS = 3


class StreamingRedactor:
    """Feeds deltas in, releases redacted text up to a whitespace boundary.

    `redact` should give a value the same placeholder each time it sees it (as
    `PiiRedactor.redact` does with shared `numbering`/`known` dicts), because pending text
    is redacted more than once before it is released.
    """

    def __init__(self, redact: Callable[[str], str], window_chars: int) -> None:
        self._redact = redact
        self._window = window_chars
        self._pending = ""
        self._last_tried = 0  # best cut of the last failed attempt

    def feed(self, delta: str) -> str:
        """Add a delta; return the redacted text that is safe to release now (maybe "")."""
        self._pending += delta
        # Only whole words count: the trailing word may still be growing.
        complete = _after_last_space(self._pending)
        cuts = _cuts_before(self._pending, complete - self._window)
        if not cuts or cuts[0] <= self._last_tried:
            return ""
        full = self._redact(self._pending[:complete])
        for cut in cuts[:_MAX_TRIALS]:
            released = self._redact(self._pending[:cut])
            if full.startswith(released):
                self._pending = self._pending[cut:]
                self._last_tried = 0
                return released
        self._last_tried = cuts[0]
        return ""

    def flush(self) -> str:
        """Redact and return everything still held; call once at the end of the stream."""
        rest, self._pending, self._last_tried = self._pending, "", 0
        return self._redact(rest) if rest else ""


def _after_last_space(text: str) -> int:
    """Index just after the last whitespace in text, or 0."""
    for i in range(len(text) - 1, -1, -1):
        if text[i].isspace():
            return i + 1
    return 0


def _cuts_before(text: str, limit: int) -> list[int]:
    """Cut positions (just after a whitespace run) at or before limit, latest first."""
    return [
        i + 1
        for i in range(min(limit, len(text)) - 1, -1, -1)
        if text[i].isspace() and (i + 1 == len(text) or not text[i + 1].isspace())
    ]

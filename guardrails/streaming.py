"""Redaction of a streamed answer, a chunk at a time: hold back a window so no entity is
released in pieces, and run the checks only once enough new text has come in.

The redact function is normally `OutputGuardrails.redactor(...)`, which composes the
output checks (prompt leaks, secrets, PII, restoring pseudonyms), so streaming applies
every one of them.

Adding a delta only appends it and notes where words end; no check runs. Once at least
`chunk_chars` new characters have come in (counted at a word's end), a check redacts
the held text up to the last whole word and releases it up to a cut at least
`window_chars` before that end. Only what is held is scanned: the window from the last
check (the overlap an entity spanning the boundary needs) and the new text.

A cut is taken only where the redaction splits there unchanged. Usually the redaction of
the held text ends with the text after the cut as it was, and so does the text after the
cut redacted alone: nothing there was found, so no entity crosses the cut (its
replacement would have taken the characters after the cut too), and nothing after it
needs the words before it as context ("version 10.2.0.1" is no IP address, "10.2.0.1"
alone is); what comes before is released. Otherwise the two sides are
redacted apart and must give the whole redaction when joined, which holds an entity that
spans the cut (e.g. "555 123 4567") or needs the words before it as context
("password: ...") until it is whole. The window must exceed the longest entity (about 40
characters for an IBAN) for this to be reliable.

With a `hold` function (`OutputGuardrails.hold_from`), the checks say how much of the
held text's end they may still need: an entity or leak that the next words could
complete, or context words for one. A cut before that point is taken at once, without
waiting for the window, so an answer's first words go out after a word or two rather than
after the window's 48 characters (a dozen decode steps). Until the first release a check
is tried at each word's end; after it, once a chunk. The window still bounds the hold: a
cut `window_chars` behind the end is always a candidate, as without `hold`.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable

# New characters between checks: a check costs a redact call over the held text.
DEFAULT_CHUNK_CHARS = 32
# Candidate cuts tried when the fast path fails; each costs two `redact` calls.
_MAX_TRIALS = 3
# A cut lies just after a run of whitespace.
_CUT = re.compile(r"\s(?=\S)")


class StreamingRedactor:
    """Takes deltas in, releases redacted text up to a whitespace boundary, in chunks.

    `redact` should give a value the same placeholder each time it sees it (as
    `PiiRedactor.redact` does with shared `numbering`/`known` dicts), because held text
    may be redacted more than once before it is released.

    `add` is cheap and can run on the event loop; `release` runs the checks and is the
    part to move off it (e.g. with `asyncio.to_thread`) when `add` says one is due.
    """

    def __init__(
        self,
        redact: Callable[[str], str],
        window_chars: int,
        chunk_chars: int = DEFAULT_CHUNK_CHARS,
        hold: Callable[[str], int | None] | None = None,
    ) -> None:
        self._redact = redact
        self._window = window_chars
        self._chunk = chunk_chars
        self._hold = hold
        self._released_any = False
        self._pending = ""
        self._cuts: list[int] = []  # cut positions in `_pending`, ascending
        self._complete = 0  # just after the last whitespace in `_pending`: whole words end here
        self._due_at = 0  # the `_complete` at which the next check is due

    def add(self, delta: str) -> bool:
        """Hold a delta; True when a check is due (call `release`)."""
        start = len(self._pending)
        self._pending += delta
        self._cuts.extend(m.end() for m in _CUT.finditer(self._pending, max(start - 1, 0)))
        for i in range(len(delta) - 1, -1, -1):
            if delta[i].isspace():
                self._complete = start + i + 1
                break
        if self._complete < self._due_at or not self._cuts:
            return False
        return self._hold is not None or self._cuts[0] <= self._complete - self._window

    def release(self) -> str:
        """Run the checks over the held whole words; return the redacted text that is safe
        to release now (maybe "")."""
        complete = self._complete
        # Before anything went out, try again at the next word's end: the first words wait
        # on nothing else.
        self._due_at = complete + (self._chunk if self._released_any else 1)
        held = self._pending[:complete]
        limit = complete - self._window
        if self._hold is not None and (hold := self._hold(held)) is not None:
            limit = max(limit, hold)
        latest = bisect.bisect_right(self._cuts, limit)
        candidates = self._cuts[max(latest - _MAX_TRIALS, 0) : latest][::-1]
        if not candidates:
            return ""
        whole = self._redact(held)
        tail = held[candidates[0] :]
        if whole.endswith(tail) and self._redact(tail) == tail:
            return self._drop(candidates[0], whole[: len(whole) - len(tail)])
        for cut in candidates:
            head = self._redact(held[:cut])
            if whole.startswith(head) and whole[len(head) :] == self._redact(held[cut:]):
                return self._drop(cut, head)
        return ""

    def feed(self, delta: str) -> str:
        """`add` and, when a check is due, `release`: the redacted text safe to release now."""
        return self.release() if self.add(delta) else ""

    def flush(self) -> str:
        """Redact and return everything still held; call once at the end of the stream."""
        rest = self._pending
        self._pending, self._cuts, self._complete, self._due_at = "", [], 0, 0
        return self._redact(rest) if rest else ""

    def _drop(self, cut: int, released: str) -> str:
        """Forget the held text before `cut`, which `released` is the redaction of."""
        self._released_any = True
        self._due_at = self._complete + self._chunk
        self._pending = self._pending[cut:]
        self._cuts = [c - cut for c in self._cuts if c > cut]
        self._complete -= cut
        self._due_at -= cut
        return released

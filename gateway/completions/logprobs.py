"""Token log-probabilities in the legacy completions shape, released only with the text
they spell.

The sampled tokens spell out the raw answer, so they would give away whatever the output
checks redacted. Entries go to the client only while the text it has received is the
raw text itself; from the first change on, the choice's remaining logprobs are withheld.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine import TextLogprob


def legacy_logprobs(entries: list[TextLogprob], offset: int) -> dict[str, Any]:
    """`{"tokens", "token_logprobs", "top_logprobs", "text_offset"}` for `entries`, the
    first of which starts at character `offset` of the choice's text."""
    offsets: list[int] = []
    for entry in entries:
        offsets.append(offset)
        offset += len(entry.token)
    return {
        "tokens": [entry.token for entry in entries],
        "token_logprobs": [entry.logprob for entry in entries],
        "top_logprobs": [_top(entry) for entry in entries],
        "text_offset": offsets,
    }


def _top(entry: TextLogprob) -> dict[str, float]:
    """The alternatives by their text; two tokens that read alike keep the likelier."""
    top: dict[str, float] = {}
    for token, logprob in entry.top:
        top[token] = max(logprob, top.get(token, logprob))
    return top


@dataclass
class LogprobGate:
    """One choice's raw answer, and its entries held until the text they spell is released."""

    raw: str = ""
    released: str = ""
    pending: list[TextLogprob] = field(default_factory=list)
    sent_chars: int = 0  # characters the entries sent so far spell
    withheld: bool = False

    def add(self, raw_text: str, entries: tuple[TextLogprob, ...]) -> None:
        self.raw += raw_text
        if not self.withheld:
            self.pending.extend(entries)

    def released_body(self, text: str, *, final: bool) -> dict[str, Any] | None:
        """`release` in the legacy shape; None once the logprobs are withheld."""
        entries, offset = self.release(text, final=final)
        return None if self.withheld else legacy_logprobs(entries, offset)

    def release(self, text: str, *, final: bool = False) -> tuple[list[TextLogprob], int]:
        """The entries that go out with `text` (the next released text), and the
        character offset of the first of them; all that are left when `final`."""
        self.released += text
        changed = self.released != self.raw if final else not self.raw.startswith(self.released)
        if self.withheld or changed:
            self.withheld, self.pending = True, []
            return [], self.sent_chars
        out: list[TextLogprob] = []
        spelled = self.sent_chars
        for entry in self.pending:
            if not final and spelled + len(entry.token) > len(self.released):
                break
            out.append(entry)
            spelled += len(entry.token)
        self.pending = self.pending[len(out) :]
        start, self.sent_chars = self.sent_chars, spelled
        return out, start

"""A streamed answer's token logprobs, handed out with the text they belong to.

Token texts are answer text: they may go out only once the output checks released that
text. Where the released text differs from what the model wrote (a redaction, a restored
placeholder), the tokens' texts are hidden from there on, their logprobs kept.
"""

from __future__ import annotations

from typing import Any

from gateway.chat.openai_format import logprobs_body
from gateway.chat.service import Choice


class LogprobRelease:
    def __init__(self, choice: Choice) -> None:
        self._choice = choice
        self._released = ""
        self._sent = 0  # entries handed out
        self._covered = 0  # characters of released text their tokens account for
        self._hidden = False

    def release(self, text: str) -> dict[str, Any] | None:
        """The logprobs of the tokens behind `text`, the next released piece of answer."""
        self._released += text
        if not "".join(self._choice.answer_parts).startswith(self._released):
            self._hidden = True
        entries = self._choice.logprobs
        first = self._sent
        while self._sent < len(entries):
            width = len(entries[self._sent].token)
            if self._covered + width > len(self._released):
                break
            self._covered += width
            self._sent += 1
        if self._sent == first:
            return None
        return logprobs_body(entries[first : self._sent], hide_tokens=self._hidden)

    def rest(self) -> dict[str, Any]:
        """The entries not handed out yet, once the answer is complete."""
        entries = self._choice.logprobs[self._sent :]
        self._sent = len(self._choice.logprobs)
        hidden = self._hidden or "".join(self._choice.answer_parts) != self._released
        return logprobs_body(entries, hide_tokens=hidden)

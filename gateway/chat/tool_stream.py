"""Streamed model text to OpenAI's streamed tool calls, parsed as the text arrives.

The model writes a call as `<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>`
(`guardrails/tool_calls.py::tool_prompt`). A streaming client expects each call's id and
name first, then its arguments JSON in fragments, so `ToolCallStream` parses chunks of any
size in one pass: text outside calls passes at once (only a possible prefix of
`<tool_call>` is held back), a call is announced as soon as its name string closes, and
the arguments object is forwarded piece by piece while its strings, escapes and brackets
are tracked to find where it ends.

Tolerated because it costs nothing: extra whitespace in the header, `"parameters"` for
`"arguments"`, a missing closing tag (text after the arguments up to `</tool_call>`, the
next `<tool_call>` or the end belongs to the call and is dropped). Whitespace next to
calls is dropped too.

A call that is not a valid call (no `{"name": "...", "arguments": ` header, arguments that
are not a JSON object or not valid JSON, an answer ending inside it) is reported once, when
its text ends, as `CallFailed` with that text; nothing of it is emitted past the point where
it broke, though its name and earlier fragments may already be out. The consumer decides
what a failure means: block the answer, as `validate_tool_calls` does, or show the text.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any, TypeAlias

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"

_NON_SPACE = re.compile(r"\S")
_STRING_SPECIAL = re.compile(r'["\\]')
_STRUCTURE_SPECIAL = re.compile(r'[{}\[\]"]')
_OPENER = {"}": "{", "]": "["}
# A header string longer than this is not a tool name or key: fail instead of buffering.
_MAX_HEADER_STRING = 256
# The header before the arguments object, whitespace allowed between the steps: a
# character to match, a key string and the names it may have, or None for the tool's name.
_HEADER: tuple[str | frozenset[str] | None, ...] = (
    "{",
    frozenset({"name"}),
    ":",
    None,
    ",",
    frozenset({"arguments", "parameters"}),
    ":",
)


@dataclass(frozen=True, slots=True)
class TextPiece:
    """Text outside tool calls."""

    text: str


@dataclass(frozen=True, slots=True)
class CallStarted:
    index: int
    call_id: str
    name: str


@dataclass(frozen=True, slots=True)
class ArgumentsPiece:
    """The next piece of call `index`'s arguments JSON, exactly as the model wrote it."""

    index: int
    fragment: str


@dataclass(frozen=True, slots=True)
class CallEnded:
    """Call `index`'s arguments are complete and parse as a JSON object."""

    index: int
    arguments: str


@dataclass(frozen=True, slots=True)
class CallFailed:
    """A call attempt that is not a valid call. `index` is None when no `CallStarted` was
    sent for it; `text` is what the model wrote for it, from `<tool_call>` to its end."""

    index: int | None
    text: str
    reason: str


ToolStreamEvent: TypeAlias = TextPiece | CallStarted | ArgumentsPiece | CallEnded | CallFailed


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tool_call_delta(event: ToolStreamEvent) -> dict[str, Any] | None:
    """OpenAI's `choices[i].delta` for an event; None for the events a client is not sent."""
    match event:
        case TextPiece(text=text):
            return {"content": text}
        case CallStarted(index=index, call_id=call_id, name=name):
            function = {"name": name, "arguments": ""}
            return {
                "tool_calls": [
                    {"index": index, "id": call_id, "type": "function", "function": function}
                ]
            }
        case ArgumentsPiece(index=index, fragment=fragment):
            return {"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}
        case _:
            return None


class _Malformed(Exception):
    """The call's header is not `{"name": "...", "arguments": {`; the message says why."""


class _Phase(Enum):
    TEXT = auto()
    HEADER = auto()
    ARGUMENTS = auto()
    TAIL = auto()  # after valid arguments, up to the call's end
    FAILED = auto()  # a broken call, kept up to its end for `CallFailed`


@dataclass
class _Header:
    """Reads `{"name": "<name>", "arguments": ` up to the arguments' opening brace."""

    step: int = 0
    string: list[str] = field(default_factory=list)  # the header string being read
    escaped: bool = False
    name: str | None = None
    done: bool = False

    def read(self, text: str, pos: int) -> int:
        """Consumes `text` from `pos`; returns early just after the name string, or at the
        arguments' `{` (not consumed, `done` set). Raises `_Malformed`."""
        while pos < len(text):
            char = text[pos]
            if self.string:
                pos += 1
                if self._read_string_char(char):
                    return pos
                continue
            if char.isspace():
                pos += 1
                continue
            if self.step == len(_HEADER):
                if char != "{":
                    raise _Malformed("the arguments are not a JSON object")
                self.done = True
                return pos
            expected = _HEADER[self.step]
            if isinstance(expected, str):
                if char != expected:
                    raise _Malformed(f"expected {expected!r} in the call's header, got {char!r}")
                self.step += 1
            elif char == '"':
                self.string.append(char)
            else:
                raise _Malformed(f"expected a string in the call's header, got {char!r}")
            pos += 1
        return pos

    def _read_string_char(self, char: str) -> bool:
        """Adds one character to the header string; True when it closed the tool's name."""
        if char < " ":
            raise _Malformed("a control character inside a header string")
        self.string.append(char)
        if len(self.string) > _MAX_HEADER_STRING:
            raise _Malformed("a header string is too long")
        if self.escaped:
            self.escaped = False
            return False
        if char == "\\":
            self.escaped = True
            return False
        if char != '"':
            return False
        try:
            value = json.loads("".join(self.string))
        except json.JSONDecodeError as error:
            raise _Malformed(f"a header string is not valid JSON: {error.msg}") from error
        self.string.clear()
        expected = _HEADER[self.step]
        self.step += 1
        if expected is None:
            if not value:
                raise _Malformed("the call's name is empty")
            self.name = value
            return True
        if not isinstance(expected, frozenset) or value not in expected:
            raise _Malformed(f"unexpected key {value!r} in the call's header")
        return False


@dataclass
class _ObjectScanner:
    """Finds where a JSON object ends by tracking strings, escapes and bracket nesting."""

    stack: list[str] = field(default_factory=list)
    in_string: bool = False
    escaped: bool = False
    closed: bool = False
    broken: bool = False

    def scan(self, text: str, pos: int) -> int:
        """Consumes `text` from `pos`; returns where it stopped: just past the object's
        last brace (`closed`), at a bracket that does not match (`broken`), or the end."""
        while pos < len(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                    pos += 1
                    continue
                match = _STRING_SPECIAL.search(text, pos)
                if match is None:
                    return len(text)
                pos = match.end()
                if match.group() == "\\":
                    self.escaped = True
                else:
                    self.in_string = False
                continue
            match = _STRUCTURE_SPECIAL.search(text, pos)
            if match is None:
                return len(text)
            char = match.group()
            if char == '"':
                self.in_string = True
            elif char in "{[":
                self.stack.append(char)
            elif not self.stack or self.stack.pop() != _OPENER[char]:
                self.broken = True
                return match.start()
            pos = match.end()
            if not self.stack:
                self.closed = True
                return pos
        return pos


def _json_object_problem(text: str) -> str | None:
    """Why balanced arguments text is still not a JSON object, or None when it is one."""
    try:
        json.loads(text, parse_constant=_refuse_constant)
    except ValueError as error:
        return f"the arguments are not valid JSON: {error}"
    return None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _partial_tag(text: str, pos: int, tag: str) -> bool:
    """Whether `text[pos:]` is a proper beginning of `tag`, so more text may complete it."""
    return len(text) - pos < len(tag) and tag.startswith(text[pos:])


class ToolCallStream:
    """Parses one answer's text, fed in chunks of any size, into `ToolStreamEvent`s.

    Each character is looked at a bounded number of times: what is held between feeds is
    at most a tag's length of text (and whitespace at the start of a text run).
    """

    def __init__(self, new_id: Callable[[], str] = new_call_id) -> None:
        self._new_id = new_id
        self._phase = _Phase.TEXT
        self._pending = ""  # a possible beginning of a tag, read again with the next text
        self._events: list[ToolStreamEvent] = []
        self._closed = False
        self._run_start = True  # at the answer's start or just after a call
        self._blank: list[str] = []  # whitespace at a text run's start, dropped before a call
        self._seen_call = False
        self._next_index = 0
        # The current call.
        self._index: int | None = None
        self._raw: list[str] = []
        self._header = _Header()
        self._scanner = _ObjectScanner()
        self._arguments: list[str] = []
        self._reason = ""

    def feed(self, text: str) -> list[ToolStreamEvent]:
        if self._closed:
            raise RuntimeError("ToolCallStream.feed() after close()")
        buffer, self._pending = self._pending + text, ""
        pos = 0
        while pos < len(buffer):
            if self._phase is _Phase.TEXT:
                pos = self._read_text(buffer, pos)
            elif self._phase is _Phase.HEADER:
                pos = self._read_header(buffer, pos)
            elif self._phase is _Phase.ARGUMENTS:
                pos = self._read_arguments(buffer, pos)
            else:
                pos = self._read_to_call_end(buffer, pos)
        return self._take_events()

    def close(self) -> list[ToolStreamEvent]:
        """The answer ended: release held text, report a call left unfinished."""
        if self._closed:
            return []
        self._closed = True
        rest, self._pending = self._pending, ""
        if self._phase is _Phase.TEXT and (rest or not self._seen_call):
            self._release("".join(self._blank) + rest)
        elif self._phase is _Phase.HEADER:
            self._fail("the answer ended inside the call's header")
        elif self._phase is _Phase.ARGUMENTS:
            self._fail("the answer ended inside the call's arguments")
        if self._phase is _Phase.FAILED:
            self._end_call(rest)
        return self._take_events()

    def _read_text(self, buffer: str, pos: int) -> int:
        end = len(buffer)
        if self._run_start:
            found = _NON_SPACE.search(buffer, pos)
            start = end if found is None else found.start()
            self._blank.append(buffer[pos:start])
            pos = start
            if pos == end:
                return end
            if buffer.startswith(OPEN_TAG, pos):
                return self._open_call(pos)
            if _partial_tag(buffer, pos, OPEN_TAG):
                self._pending = buffer[pos:]
                return end
            self._run_start = False
        lead = "".join(self._blank)
        self._blank.clear()
        tag = buffer.find("<", pos)
        while tag != -1:
            if buffer.startswith(OPEN_TAG, tag):
                self._release(lead + buffer[pos:tag])
                return self._open_call(tag)
            if _partial_tag(buffer, tag, OPEN_TAG):
                self._release(lead + buffer[pos:tag])
                self._pending = buffer[tag:]
                return end
            tag = buffer.find("<", tag + 1)
        self._release(lead + buffer[pos:])
        return end

    def _open_call(self, tag: int) -> int:
        self._phase = _Phase.HEADER
        self._blank.clear()
        self._seen_call = True
        self._index = None
        self._raw = [OPEN_TAG]
        self._header = _Header()
        return tag + len(OPEN_TAG)

    def _read_header(self, buffer: str, pos: int) -> int:
        try:
            stop = self._header.read(buffer, pos)
        except _Malformed as error:
            # The broken call's text is collected again from `pos` while looking for its end.
            self._fail(str(error))
            return pos
        self._raw.append(buffer[pos:stop])
        name = self._header.name
        if name is not None and self._index is None:
            self._index, self._next_index = self._next_index, self._next_index + 1
            self._events.append(CallStarted(self._index, self._new_id(), name))
        if self._header.done:
            self._phase = _Phase.ARGUMENTS
            self._scanner = _ObjectScanner()
            self._arguments = []
        return stop

    def _read_arguments(self, buffer: str, pos: int) -> int:
        assert self._index is not None
        stop = self._scanner.scan(buffer, pos)
        if stop > pos:
            piece = buffer[pos:stop]
            self._raw.append(piece)
            self._arguments.append(piece)
            self._events.append(ArgumentsPiece(self._index, piece))
        if self._scanner.broken:
            self._fail("the arguments' brackets do not match")
        elif self._scanner.closed:
            arguments = "".join(self._arguments)
            problem = _json_object_problem(arguments)
            if problem is not None:
                self._fail(problem)
            else:
                self._events.append(CallEnded(self._index, arguments))
                self._phase = _Phase.TAIL
                self._raw = []
        return stop

    def _read_to_call_end(self, buffer: str, pos: int) -> int:
        """Skips the rest of a call, up to `</tool_call>` (included) or `<tool_call>`."""
        tag = buffer.find("<", pos)
        while tag != -1:
            if buffer.startswith(CLOSE_TAG, tag):
                stop = tag + len(CLOSE_TAG)
                self._end_call(buffer[pos:stop])
                return stop
            if buffer.startswith(OPEN_TAG, tag):
                self._end_call(buffer[pos:tag])
                return tag
            if _partial_tag(buffer, tag, CLOSE_TAG) or _partial_tag(buffer, tag, OPEN_TAG):
                self._raw.append(buffer[pos:tag])
                self._pending = buffer[tag:]
                return len(buffer)
            tag = buffer.find("<", tag + 1)
        self._raw.append(buffer[pos:])
        return len(buffer)

    def _fail(self, reason: str) -> None:
        self._phase = _Phase.FAILED
        self._reason = reason

    def _end_call(self, last: str) -> None:
        if self._phase is _Phase.FAILED:
            self._raw.append(last)
            self._events.append(CallFailed(self._index, "".join(self._raw), self._reason))
        self._raw = []
        self._phase = _Phase.TEXT
        self._run_start = True

    def _release(self, text: str) -> None:
        if text:
            self._events.append(TextPiece(text))

    def _take_events(self) -> list[ToolStreamEvent]:
        events, self._events = self._events, []
        return events

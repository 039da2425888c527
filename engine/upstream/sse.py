"""Server-sent events as OpenAI-compatible servers stream them: one JSON object a `data:`
line, `data: [DONE]` at the end; blank lines, comments and other fields carry nothing."""

from __future__ import annotations

import json
from typing import Any, Final


class MalformedStream(ValueError):
    """A line that is not the SSE an OpenAI-compatible server sends."""


DONE: Final = "[DONE]"


def parse_line(line: str) -> dict[str, Any] | str | None:
    """A `data:` line's JSON object, `DONE` at the end, None for lines that carry nothing."""
    line = line.rstrip("\r")
    if not line or line.startswith(":"):
        return None
    field, _, value = line.partition(":")
    if field != "data":
        if field in ("event", "id", "retry"):
            return None
        raise MalformedStream(f"not an SSE line: {line[:80]!r}")
    value = value.removeprefix(" ")
    if value == DONE:
        return DONE
    try:
        event = json.loads(value)
    except json.JSONDecodeError as exc:
        raise MalformedStream(f"a data line that is not JSON: {value[:80]!r}") from exc
    if not isinstance(event, dict):
        raise MalformedStream(f"a data line that is not a JSON object: {value[:80]!r}")
    return event

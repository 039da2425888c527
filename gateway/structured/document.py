"""A client's schema as a JSON document: its size and depth, measured without recursion
(the document is untrusted: a 10,000-level nesting must not reach Python's stack)."""

from __future__ import annotations

import json
import math

from gateway.structured.errors import SchemaProblem

PathPart = str | int
Path = tuple[PathPart, ...]


def json_path(path: Path) -> str:
    """`path` as jsonschema writes it: `$.properties.name`, `$.anyOf[0]`, `$['a b']`."""
    parts = ["$"]
    for part in path:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        elif part.isidentifier():
            parts.append(f".{part}")
        else:
            parts.append(f"[{json.dumps(part)}]")
    return "".join(parts)


def check_document(schema: object, max_bytes: int, max_depth: int) -> None:
    """Refuse a document that is not JSON, nests deeper than `max_depth` or holds more
    than `max_bytes` as compact JSON; stops at the first container past a limit."""
    # A lower bound on the compact size, kept as the walk goes, so that a huge document
    # stops early; scalars are measured where they stand, only containers are stacked.
    estimate = _scalar_size(schema, ()) if not isinstance(schema, dict | list) else 0
    stack: list[tuple[dict[str, object] | list[object], Path]] = []
    if isinstance(schema, dict | list):
        stack.append((schema, ()))
    while stack:
        container, path = stack.pop()
        if len(path) >= max_depth:
            raise SchemaProblem(
                f"the schema nests deeper than {max_depth} levels at "
                f"{_shortened(json_path(path))} (structured_output.max_depth)"
            )
        estimate += 2
        items = container.items() if isinstance(container, dict) else enumerate(container)
        for key, item in items:
            if isinstance(key, str):
                estimate += len(key) + 3
            elif isinstance(container, dict):
                raise SchemaProblem(f"a key at {json_path(path)} is not a string")
            if isinstance(item, dict | list):
                stack.append((item, (*path, key)))
                estimate += 1
            else:
                estimate += _scalar_size(item, (*path, key)) + 1
            if estimate > max_bytes:
                raise _too_large(max_bytes)
    size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode())
    if size > max_bytes:
        raise _too_large(max_bytes)


def _shortened(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _scalar_size(value: object, path: Path) -> int:
    if isinstance(value, str):
        return len(value) + 2
    if value is None or isinstance(value, bool):
        return 4
    if isinstance(value, int):
        return value.bit_length() * 3 // 10 + 1  # its decimal digits, without printing it
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SchemaProblem(f"the number at {json_path(path)} is not finite")
        return len(repr(value))
    raise SchemaProblem(f"the value at {json_path(path)} is not JSON")


def _too_large(max_bytes: int) -> SchemaProblem:
    return SchemaProblem(
        f"the schema is larger than {max_bytes} bytes (structured_output.max_schema_bytes)"
    )

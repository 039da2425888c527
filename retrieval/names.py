"""Which tenant and collection names a store accepts."""

from __future__ import annotations

import re

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


def check_name(kind: str, value: str) -> None:
    """Tenant and collection names become path parts, so only plain names are allowed."""
    if not _NAME.match(value) or value in {".", ".."}:
        raise ValueError(
            f"invalid {kind} name {value!r}: use 1-128 letters, digits, '_', '.' or '-' "
            "(and not '.' or '..')"
        )

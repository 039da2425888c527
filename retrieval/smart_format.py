"""Records of a SMART-format test collection (Cranfield's `.I` records with `.T`, `.A`,
`.B`, `.W` fields): the retrieval bench's documents and queries, the injection
classifier's harmless texts, and the benches' long prose."""

from __future__ import annotations

import re
from pathlib import Path

_RECORD_START = re.compile(r"^\.I ", flags=re.MULTILINE)
_FIELD_LINE = re.compile(r"^\.[A-Z]$")


def records(path: Path) -> list[dict[str, str]]:
    """Each record's fields by letter ("I" is its id), whitespace normalised."""
    text = path.read_text(encoding="ascii", errors="replace")
    parsed = []
    for block in _RECORD_START.split(text)[1:]:
        lines = block.splitlines()
        record = {"I": lines[0]}
        field = None
        for line in lines[1:]:
            if _FIELD_LINE.match(line.strip()):
                field = line.strip()[1]
                record.setdefault(field, "")  # a few records repeat a field: one text
            elif field is not None:
                record[field] += line + "\n"
        parsed.append({name: " ".join(value.split()) for name, value in record.items()})
    return parsed


def texts(path: Path, min_chars: int = 0) -> list[str]:
    """The `.W` texts (abstracts, or the queries of `cran.qry`) longer than `min_chars`."""
    return [r["W"] for r in records(path) if len(r.get("W", "")) > min_chars]

"""Rewrite one benchmark's own section of docs/benchmarks.md, between its markers."""

from __future__ import annotations

from pathlib import Path

DOCS_MD = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def write_section(name: str, body: str, doc: Path = DOCS_MD) -> None:
    """Replace `<!-- name:start -->` ... `<!-- name:end -->`, or append the section at the
    end when the markers are not there yet; the rest of the file is left as it is."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    current = doc.read_text(encoding="utf-8")
    section = f"{start}\n{body}\n{end}"
    if start in current and end in current:
        head, rest = current.split(start, 1)
        updated = head + section + rest.split(end, 1)[1]
    else:
        updated = current.rstrip("\n") + "\n\n" + section + "\n"
    doc.write_text(updated, encoding="utf-8")

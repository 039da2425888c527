"""Render retrieved chunks as a numbered source list for the system prompt."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePath

from retrieval.store import RetrievedChunk

_HEADER = "Use the following sources to answer. Cite them as [1], [2]..."


def format_context(chunks: Sequence[RetrievedChunk]) -> str:
    """Number `chunks` in the order given as [1], [2]...; "" when there are none."""
    if not chunks:
        return ""
    blocks = [_HEADER]
    for number, chunk in enumerate(chunks, start=1):
        name = PurePath(chunk.source).name or chunk.source
        blocks.append(f"[{number}] {chunk.title} ({name})\n{chunk.text}")
    return "\n\n".join(blocks)

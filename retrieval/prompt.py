"""Render retrieved chunks as a numbered source list for the system prompt."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import PurePath

from retrieval.results import RetrievedChunk

_HEADER = "Use the following sources to answer. Cite them as [1], [2]..."
DEFAULT_CONTEXT_CHARS = 6000


def select_for_prompt(
    chunks: Sequence[RetrievedChunk],
    budget: int = DEFAULT_CONTEXT_CHARS,
    count_tokens: Callable[[str], int] | None = None,
) -> list[RetrievedChunk]:
    """The chunks `format_context` puts in the prompt, in the order it numbers them.

    Takes chunks in the given (relevance) order while their rendered blocks fit in `budget`
    (characters, or tokens with `count_tokens`), then sorts them by document and position,
    so that the same sources always render the same prompt text and prefix caches hit.
    Number citations with this list.
    """
    count = count_tokens if count_tokens is not None else len
    used = count(_HEADER)
    kept: list[RetrievedChunk] = []
    for chunk in chunks:
        # The number is not known yet; "[99] " is as long as any realistic one.
        size = count(_block(99, chunk)) + count("\n\n")
        if used + size > budget:
            continue
        kept.append(chunk)
        used += size
    return sorted(kept, key=lambda c: (c.source, c.document_id, c.ordinal, c.chunk_id))


def format_context(
    chunks: Sequence[RetrievedChunk],
    budget: int = DEFAULT_CONTEXT_CHARS,
    count_tokens: Callable[[str], int] | None = None,
) -> str:
    """Number `select_for_prompt(chunks, ...)` as [1], [2]... with their sources; "" if none."""
    selected = select_for_prompt(chunks, budget, count_tokens)
    if not selected:
        return ""
    blocks = [_HEADER, *(_block(n, c) for n, c in enumerate(selected, start=1))]
    return "\n\n".join(blocks)


def _block(number: int, chunk: RetrievedChunk) -> str:
    name = chunk.source if "://" in chunk.source else PurePath(chunk.source).name or chunk.source
    where = [name]
    if chunk.page is not None:
        where.append(f"p. {chunk.page}")
    if chunk.section:
        where.append(chunk.section)
    return f"[{number}] {chunk.title} ({', '.join(where)})\n{chunk.text}"

"""The retrieval stage of a chat request: the sources its prompt cites, found beside the
input checks and given up as soon as a check blocks the request.

Retrieval runs on a worker thread, which asyncio cannot interrupt; a block sets the
request's `threading.Event` instead, and the search stops at its next step (before the
index search, and before the retrieved text is screened for instructions).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

from gateway.policy.schema import RetrievalSettings
from guardrails import InjectionDetector, Verdict
from retrieval import DocumentStore, RetrievedChunk, select_for_prompt


@dataclass(frozen=True, slots=True)
class Sources:
    """What retrieval gives a prompt: its chunks in citation order, a verdict for each
    chunk dropped for carrying instructions, and whether a block stopped it first."""

    chunks: list[RetrievedChunk]
    dropped: list[Verdict]
    cancelled: bool = False


def find_sources(
    store: DocumentStore,
    untrusted_text: InjectionDetector,
    settings: RetrievalSettings,
    tenant: str | None,
    query: str,
    cancelled: threading.Event,
) -> Sources:
    """The sources for `query` in the tenant's collections (retrieved text is untrusted:
    a chunk that carries instructions is dropped, with a verdict)."""
    if not settings.enabled or not query or tenant is None:
        return Sources([], [])
    if cancelled.is_set():
        return Sources([], [], cancelled=True)
    found = store.search(tenant, settings.collections, query, settings.top_k, settings.min_score)
    if cancelled.is_set():
        return Sources([], [], cancelled=True)
    verdicts = untrusted_text.scan_untrusted([c.text for c in found])
    kept: list[RetrievedChunk] = []
    dropped: list[Verdict] = []
    for chunk, verdict in zip(found, verdicts, strict=True):
        if verdict.action == "block":
            evidence = (f"chunk {chunk.chunk_id}", *verdict.evidence)
            dropped.append(replace(verdict, evidence=evidence))
        if not verdict.blocks:
            kept.append(chunk)
    # The prompt numbers sources in this order; citations must use the same numbers.
    return Sources(select_for_prompt(kept), dropped)

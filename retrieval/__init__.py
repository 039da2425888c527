"""Document ingestion, chunking, embedding and dense search for retrieval-augmented prompts."""

from __future__ import annotations

from retrieval.chunking import chunk_text, title_of
from retrieval.embedder import Embedder
from retrieval.models import Chunk, Document, RetrievalBase
from retrieval.prompt import format_context
from retrieval.store import DocumentStore, IngestResult, RetrievedChunk
from retrieval.vector_index import VectorIndex

__all__ = [
    "Chunk",
    "Document",
    "DocumentStore",
    "Embedder",
    "IngestResult",
    "RetrievalBase",
    "RetrievedChunk",
    "VectorIndex",
    "chunk_text",
    "format_context",
    "title_of",
]

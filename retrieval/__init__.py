"""Document ingestion, chunking, hybrid search and reranking for retrieval-augmented prompts."""

from __future__ import annotations

from retrieval.chunking import Section, TextChunk, chunk_sections, chunk_text, title_of
from retrieval.embedder import Embedder
from retrieval.loaders import ParsedDocument, UnsupportedDocumentError, parse_document
from retrieval.models import Chunk, Document, RetrievalBase
from retrieval.prompt import format_context, select_for_prompt
from retrieval.rerank import (
    Candidate,
    CrossEncoderReranker,
    LateInteractionReranker,
    Reranker,
    load_reranker,
)
from retrieval.results import (
    DocumentInfo,
    IngestResult,
    RetrievedChunk,
    SearchFilter,
    SearchMode,
)
from retrieval.store import DocumentStore
from retrieval.vector_index import VectorIndex

__all__ = [
    "Candidate",
    "Chunk",
    "CrossEncoderReranker",
    "Document",
    "DocumentInfo",
    "DocumentStore",
    "Embedder",
    "IngestResult",
    "LateInteractionReranker",
    "ParsedDocument",
    "Reranker",
    "RetrievalBase",
    "RetrievedChunk",
    "SearchFilter",
    "SearchMode",
    "Section",
    "TextChunk",
    "UnsupportedDocumentError",
    "VectorIndex",
    "chunk_sections",
    "chunk_text",
    "format_context",
    "load_reranker",
    "parse_document",
    "select_for_prompt",
    "title_of",
]

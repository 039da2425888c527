"""The long-lived parts a running gateway needs, loaded once at start-up."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import structlog
import torch
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from engine import (
    Engine,
    EngineConfig,
    PagedEngine,
    default_model_source,
    model_source_from_path,
)
from gateway.audit.log import AuditLog
from gateway.db.connection import make_db_engine, make_session_factory
from gateway.db.migrations import upgrade_database
from gateway.limits.rate_limit import RateLimiter, make_rate_limiter
from gateway.policy.registry import PolicyRegistry
from gateway.policy.runtime import PolicyRuntime, open_policies
from gateway.settings import Settings
from retrieval import DocumentStore, Embedder
from retrieval.models import Document

log = structlog.get_logger(__name__)


@dataclass
class Services:
    """Everything a request needs; built by `load_services`, handed to the app."""

    settings: Settings
    sessions: sessionmaker[Session]
    engine: Engine
    embedder: Embedder
    store: DocumentStore
    policies: PolicyRegistry[PolicyRuntime]
    audit: AuditLog
    limiter: RateLimiter


def open_database(settings: Settings) -> sessionmaker[Session]:
    """Bring the schema up to date (Alembic) and return a session factory."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade_database(settings.resolved_database_url)
    return make_session_factory(make_db_engine(settings.resolved_database_url))


def engine_config(settings: Settings) -> EngineConfig:
    """The engine's settings as the operator gave them; the engine resolves `auto`
    weights for its device itself."""
    config = EngineConfig(
        weights=settings.engine_weights,
        num_threads=settings.engine_threads,
        native_decode=settings.native_decode,
        native_cache_dir=settings.native_cache_dir,
        speculative_tokens=settings.speculative_tokens,
    )
    if settings.kv_cache_mb is None:
        return config
    return replace(config, kv_cache_mb=settings.kv_cache_mb)


def load_engine(settings: Settings) -> Engine:
    """The embedded engine on the configured model (default: SmolLM2) and device."""
    source = model_source_from_path(settings.model_path) if settings.model_path else None
    device = settings.device or ("cuda" if torch.cuda.is_available() else "cpu")
    return PagedEngine.load(
        source or default_model_source(), device=device, config=engine_config(settings)
    )


def load_services(
    settings: Settings, *, engine: Engine | None = None, embedder: Embedder | None = None
) -> Services:
    """Load database, models, indexes and policy; ingest the sample corpus on first start.

    `engine` and `embedder` are loaded from the settings unless given (tests share one
    engine between servers; the wiring is the same either way).
    """
    started = time.perf_counter()
    sessions = open_database(settings)
    engine = engine or load_engine(settings)
    embedder = embedder or Embedder.load()
    # Requests get their own copy: bf16 where native, on the cores the engine leaves.
    request_embedder = embedder.request_copy()
    store = DocumentStore(sessions, embedder, settings.index_dir, query_embedder=request_embedder)
    if settings.sample_corpus is not None:
        ingest_sample_corpus(settings, sessions, store, settings.sample_corpus)
    audit = AuditLog(sessions)
    services = Services(
        settings=settings,
        sessions=sessions,
        engine=engine,
        embedder=embedder,
        store=store,
        policies=open_policies(settings.policy_dir, request_embedder, audit),
        audit=audit,
        limiter=make_rate_limiter(settings.redis_url),
    )
    log.info("gateway.services_ready", seconds=round(time.perf_counter() - started, 1))
    return services


def ingest_sample_corpus(
    settings: Settings, sessions: sessionmaker[Session], store: DocumentStore, corpus: Path
) -> None:
    """Ingest the shipped sample documents into the default tenant once, on first start."""
    tenant, collection = settings.default_tenant, settings.default_collection
    with sessions() as session:
        present = session.scalar(select(Document.id).where(Document.tenant == tenant).limit(1))
    if present is not None or not corpus.is_dir():
        return
    results = store.ingest_paths([corpus], tenant=tenant, collection=collection, progress=True)
    log.info("sample_corpus.ingested", documents=len(results), collection=collection)

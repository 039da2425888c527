"""The long-lived parts a running gateway needs, loaded once at start-up."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import structlog
import torch
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from engine import (
    Engine,
    EngineConfig,
    ModelSource,
    PagedEngine,
    default_model_source,
    model_source_from_path,
    resolve_engine_config,
)
from engine.prepared_weights import PreparedModel, load_prepared
from gateway.audit.log import AuditLog
from gateway.db.connection import make_db_engine, make_session_factory
from gateway.db.migrations import upgrade_database
from gateway.limits.rate_limit import RateLimiter, make_rate_limiter
from gateway.load_memory import large_allocations_unmapped_when_freed, return_freed_memory
from gateway.models import ModelRegistry, load_models_file
from gateway.policy.registry import PolicyRegistry
from gateway.policy.runtime import PolicyRuntime, open_policies
from gateway.settings import Settings
from guardrails import build_analyzer
from retrieval import DocumentStore, Embedder
from retrieval.models import Document

log = structlog.get_logger(__name__)
T = TypeVar("T")


@dataclass
class Services:
    """Everything a request needs; built by `load_services`, handed to the app."""

    settings: Settings
    sessions: sessionmaker[Session]
    engine: Engine | None  # the embedded engine; None where the models file turns it off
    embedder: Embedder
    store: DocumentStore
    policies: PolicyRegistry[PolicyRuntime]
    audit: AuditLog
    limiter: RateLimiter
    models: ModelRegistry  # the embedded `engine` and the models file's upstream engines


def open_database(settings: Settings) -> sessionmaker[Session]:
    """Bring the schema up to date (Alembic) and return a session factory."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    upgrade_database(settings.resolved_database_url)
    return make_session_factory(
        make_db_engine(settings.resolved_database_url, settings.sqlite_synchronous)
    )


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
    # Settings left unset keep the engine's own defaults.
    if settings.engine_max_seqs is not None:
        config = replace(config, max_num_seqs=settings.engine_max_seqs)
    if settings.kv_cache_mb is not None:
        config = replace(config, kv_cache_mb=settings.kv_cache_mb)
    return config


def load_engine(settings: Settings) -> Engine:
    """The embedded engine on the configured model (default: SmolLM2) and device."""
    return PagedEngine.load(
        _engine_model(settings), device=_engine_device(settings), config=engine_config(settings)
    )


def load_engine_model(settings: Settings) -> PreparedModel | None:
    """The embedded model with its weights prepared and kept for the next start, where they
    are kept at all (`bastion prepare`); the engine itself is not started."""
    device = _engine_device(settings)
    config = resolve_engine_config(engine_config(settings), device)
    return load_prepared(_engine_model(settings), torch.device(device), config)


def _engine_model(settings: Settings) -> ModelSource:
    if settings.model_path:
        return model_source_from_path(settings.model_path)
    return default_model_source()


def _engine_device(settings: Settings) -> str:
    return settings.device or ("cuda" if torch.cuda.is_available() else "cpu")


def load_services(
    settings: Settings, *, engine: Engine | None = None, embedder: Embedder | None = None
) -> Services:
    """Load database, models, indexes and policy; ingest the sample corpus on first start.

    `engine` and `embedder` are loaded from the settings unless given (tests share one
    engine between servers; the wiring is the same either way).
    """
    started = time.perf_counter()
    # A bad models file stops the start before anything slow loads.
    models_file = load_models_file(settings.models_file) if settings.models_file else None
    embedded = engine is not None or models_file is None or models_file.embedded
    sessions = open_database(settings)
    # The engine and the PII analyzer load on threads of their own while this one loads the
    # embedder and ingests the sample corpus: most of each is numpy, torch or file reads,
    # which release the GIL (bench/cold_start.py measures the start).
    with (
        large_allocations_unmapped_when_freed(),
        ThreadPoolExecutor(max_workers=2, thread_name_prefix="load") as loaders,
    ):
        engine_loaded: Future[Engine | None] = (
            loaders.submit(_timed, "engine", load_engine, settings)
            if engine is None and embedded
            else _given(engine)
        )
        analyzer_loaded = loaders.submit(_timed, "pii_analyzer", build_analyzer)
        embedder = embedder or _timed("embedder", Embedder.load)
        # Requests get their own copy: bf16 where native, on the cores the engine leaves.
        request_embedder = embedder.for_requests()
        store = DocumentStore(
            sessions, embedder, settings.index_dir, query_embedder=request_embedder
        )
        if settings.sample_corpus is not None:
            _timed(
                "sample_corpus",
                ingest_sample_corpus,
                settings,
                sessions,
                store,
                settings.sample_corpus,
            )
        audit = AuditLog(sessions)
        analyzer_loaded.result()  # the policies' PII checks take the analyzer built there
        policies = _timed("policies", open_policies, settings.policy_dir, request_embedder, audit)
        served = engine_loaded.result()
    models = ModelRegistry(settings.models_file, served)
    models.reload(actor="startup")
    services = Services(
        settings=settings,
        sessions=sessions,
        engine=served,
        embedder=embedder,
        store=store,
        policies=policies,
        audit=audit,
        limiter=make_rate_limiter(settings.redis_url),
        models=models,
    )
    return_freed_memory()
    log.info("gateway.services_ready", seconds=round(time.perf_counter() - started, 1))
    return services


def _given(value: T) -> Future[T]:
    """A value already at hand, as a loader's result."""
    given: Future[T] = Future()
    given.set_result(value)
    return given


def _timed(stage: str, load: Callable[..., T], *args: Any) -> T:
    """`load(*args)`, logging how long the start-up stage took."""
    started = time.perf_counter()
    result = load(*args)
    log.info("gateway.stage_loaded", stage=stage, seconds=round(time.perf_counter() - started, 2))
    return result


def ingest_sample_corpus(
    settings: Settings, sessions: sessionmaker[Session], store: DocumentStore, corpus: Path
) -> None:
    """Ingest the shipped sample documents into the default tenant once, on first start."""
    tenant, collection = settings.default_tenant, settings.default_collection
    with sessions() as session:
        present = session.scalar(select(Document.id).where(Document.tenant == tenant).limit(1))
    if present is not None or not corpus.is_dir():
        return
    results = store.ingest_paths([corpus], tenant=tenant, collection=collection, progress=False)
    log.info("sample_corpus.ingested", documents=len(results), collection=collection)

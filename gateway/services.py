"""The long-lived parts a running gateway needs, loaded once at start-up."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
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
from engine.config import kv_cache_mb_from_env
from engine.linear import WeightFormat, fbgemm_supported
from engine.native_decode import load_library as load_native_decode
from gateway.audit.log import AuditEntry, AuditLog
from gateway.db.connection import make_db_engine, make_session_factory
from gateway.db.migrations import upgrade_database
from gateway.policy.schema import LoadedPolicy
from gateway.policy.registry import PolicyChange, PolicyRegistry
from gateway.limits.rate_limit import RateLimiter, make_rate_limiter
from gateway.settings import Settings
from guardrails import (
    InjectionDetector,
    InputGuardrails,
    LeakDetector,
    OutputGuardrails,
    PiiRedactor,
    SecretsFilter,
    TopicMatcher,
    build_analyzer,
)
from retrieval import DocumentStore, Embedder
from retrieval.models import Document

log = structlog.get_logger(__name__)


@dataclass
class PolicyRuntime:
    """A policy together with the guardrail objects built from it."""

    loaded: LoadedPolicy
    input_guardrails: InputGuardrails
    output: OutputGuardrails
    untrusted_text: InjectionDetector


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


def build_policy_runtime(loaded: LoadedPolicy, embedder: Embedder) -> PolicyRuntime:
    """The guardrails one policy asks for (raises when the policy cannot be honoured)."""
    policy = loaded.policy
    checks, answers = policy.input, policy.output
    topics = TopicMatcher(embedder, checks.topics) if checks.topics.enabled else None
    injection = InjectionDetector(checks.injection, embed=embedder)
    input_pii = PiiRedactor(build_analyzer(tuple(checks.pii.countries)), checks.pii)
    output_pii = PiiRedactor(build_analyzer(tuple(answers.pii.countries)), answers.pii)
    return PolicyRuntime(
        loaded=loaded,
        input_guardrails=InputGuardrails(injection, input_pii, topics),
        output=OutputGuardrails(
            output_pii,
            SecretsFilter(answers.secrets),
            LeakDetector(answers.leaks, policy.model.system_prompt),
        ),
        untrusted_text=injection,
    )


def open_policies(
    settings: Settings, embedder: Embedder, audit: AuditLog
) -> PolicyRegistry[PolicyRuntime]:
    """Load every policy of the folder; each change is audited from then on."""
    registry: PolicyRegistry[PolicyRuntime] = PolicyRegistry(
        settings.policy_dir,
        lambda loaded: build_policy_runtime(loaded, embedder),
        on_change=lambda change: audit.record(policy_change_entry(change)),
    )
    registry.reload(actor="startup")
    return registry


def policy_change_entry(change: PolicyChange) -> AuditEntry:
    return AuditEntry(
        request_id=f"policy_{uuid.uuid4().hex}",
        endpoint="policy-watcher",
        event="policy.reload_failed" if change.error else "policy.reloaded",
        policy_version=change.new_version or change.old_version,
        outcome="rejected" if change.error else "ok",
        status_code=0,
        details={
            "actor": change.actor,
            "path": str(change.path),
            "policy": change.name,
            "old_version": change.old_version,
            "new_version": change.new_version,
            "error": change.error,
        },
    )


def engine_config(settings: Settings, device: str) -> EngineConfig:
    """The engine's settings: the KV budget, its threads, and quantized weights where they
    pay off: on a CPU, int8 where the native decode step builds (as faithful as fp16 and
    about 3x faster, docs/benchmarks.md), else fp16 where fbgemm runs it."""
    weights: WeightFormat
    if settings.engine_weights != "auto":
        weights = settings.engine_weights
    elif device != "cpu":
        weights = "float"
    elif load_native_decode() is not None:
        weights = "int8"  # decode steps in one native call (engine/native_decode.py)
    else:
        weights = "fp16" if fbgemm_supported() else "int8"
    return EngineConfig(
        kv_cache_mb=settings.kv_cache_mb or kv_cache_mb_from_env(),
        weights=weights,
        num_threads=settings.engine_threads,
    )


def load_services(settings: Settings) -> Services:
    """Load database, models, indexes and policy; ingest the sample corpus on first start."""
    started = time.perf_counter()
    sessions = open_database(settings)
    source = model_source_from_path(settings.model_path) if settings.model_path else None
    device = settings.device or ("cuda" if torch.cuda.is_available() else "cpu")
    engine = PagedEngine.load(
        source or default_model_source(), device=device, config=engine_config(settings, device)
    )
    embedder = Embedder.load()
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
        # The guardrails get their own copy: bf16 where native, on the cores the engine leaves.
        policies=open_policies(settings, request_embedder, audit),
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

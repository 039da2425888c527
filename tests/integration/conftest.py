"""A live Bastion server on 127.0.0.1, built from the real components, for client tests."""

from __future__ import annotations

import shutil
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from openai import OpenAI
from sqlalchemy import select

from engine import (
    ChatMessage,
    EngineMetrics,
    GenerationRequest,
    PagedEngine,
    SamplingParams,
    TokenDelta,
)
from gateway.audit.subject_keys import TextOpener
from gateway.db.models import AuditRecord
from gateway.keys.store import create_key
from gateway.policy.registry import PolicyRegistry
from gateway.services import Services, load_services
from gateway.settings import REPO_ROOT, Settings
from tests.support.local_server import free_port, serve_in_thread


class RecordingEngine:
    """Passes every call to the real engine and remembers what it was asked to run."""

    def __init__(self, inner: PagedEngine) -> None:
        self._inner = inner
        self.received: dict[str, tuple[ChatMessage, ...]] = {}
        self.prompts: dict[str, str] = {}  # raw-text prompts (`/v1/completions`)
        self.sampling: dict[str, SamplingParams] = {}

    @property
    def model_id(self) -> str:
        return self._inner.model_id

    @property
    def context_window(self) -> int:
        return self._inner.context_window

    @property
    def vocab_size(self) -> int:
        return self._inner.vocab_size

    def count_prompt_tokens(self, messages: Sequence[ChatMessage]) -> int:
        return self._inner.count_prompt_tokens(messages)

    def count_text_tokens(self, text: str) -> int:
        return self._inner.count_text_tokens(text)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[TokenDelta]:
        self.received[request.request_id] = request.messages
        self.sampling[request.request_id] = request.sampling
        if request.prompt is not None:
            self.prompts[request.request_id] = request.prompt
        async for delta in self._inner.stream(request):
            yield delta

    def metrics(self) -> EngineMetrics:
        """The real engine's metrics, so that `/metrics` reports them as in production."""
        return self._inner.metrics()

    def close(self) -> None:
        """The session fixture owns the real engine."""


@dataclass
class LiveServer:
    base_url: str
    api_key: str
    services: Services
    engine: RecordingEngine
    settings: Settings
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def policy_version(self) -> str:
        runtime = self.services.policies.for_tenant(self.settings.default_tenant)
        assert runtime is not None
        return runtime.loaded.version

    def audit_text(self, request_id: str) -> tuple[str | None, str | None]:
        """The stored prompt and answer of a request, decrypted as an auditor reads them."""
        with self.services.sessions() as session:
            row = session.scalars(
                select(AuditRecord).where(AuditRecord.request_id == request_id)
            ).one()
            opener = TextOpener(session)
            return opener.open(row.prompt_text), opener.open(row.answer_text)

    def audit_rows(self, request_id: str) -> list[AuditRecord]:
        with self.services.sessions() as session:
            return list(
                session.scalars(select(AuditRecord).where(AuditRecord.request_id == request_id))
            )


@contextmanager
def tenant_client(live_server: LiveServer, name: str, policy: str) -> Iterator[OpenAI]:
    """The `openai` client of a user key of tenant `name`, whose policy file (`policy`, the
    YAML text) is in the policy folder until the block ends."""
    path = live_server.settings.policy_dir / f"{name}.yaml"
    path.write_text(policy)
    try:
        wait_for_policy(live_server.services.policies, name)
        secret, _ = create_key(live_server.services.sessions, name, "user")
        yield OpenAI(
            base_url=f"{live_server.base_url}/v1", api_key=secret, max_retries=0, timeout=120
        )
    finally:
        path.unlink()


def wait_for_policy(registry: PolicyRegistry, tenant: str) -> None:
    """Until the registry has picked up a policy file written for `tenant` (20 s at most)."""
    deadline = time.monotonic() + 20
    while registry.for_tenant(tenant) is None:
        assert time.monotonic() < deadline, f"no policy was bound to {tenant}"
        time.sleep(0.1)


@pytest.fixture(scope="session")
def live_server(
    tmp_path_factory: pytest.TempPathFactory, chat_engine: PagedEngine
) -> Iterator[LiveServer]:
    data_dir: Path = tmp_path_factory.mktemp("bastion-data")
    policy_dir = tmp_path_factory.mktemp("policies")
    shutil.copy(REPO_ROOT / "policies" / "default.yaml", policy_dir / "default.yaml")
    settings = Settings(
        data_dir=data_dir, port=free_port(), policy_dir=policy_dir, policy_reload_seconds=0.2
    )
    engine = RecordingEngine(chat_engine)
    services = load_services(settings, engine=engine)
    sessions = services.sessions
    secret, _ = create_key(sessions, settings.default_tenant, "user")
    with serve_in_thread(settings, services) as base_url:
        yield LiveServer(base_url, secret, services, engine, settings)


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> OpenAI:
    """The official `openai` client on the live server, with the server's user key."""
    return OpenAI(
        base_url=f"{live_server.base_url}/v1",
        api_key=live_server.api_key,
        max_retries=0,
        timeout=300,
    )

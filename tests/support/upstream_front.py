"""A live Bastion with the embedded engine off, in front of the upstream models a models
file names: what the upstream integration tests stand up around their upstreams."""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.keys.store import create_key
from gateway.services import Services, load_services
from gateway.settings import REPO_ROOT, Settings
from tests.support.local_server import free_port, serve_in_thread

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider


@dataclass(frozen=True)
class UpstreamFront:
    base_url: str
    settings: Settings
    services: Services
    secret: str  # a user key of the default tenant


def models_yaml(urls: Mapping[str, str]) -> str:
    """A models file: each model id in front of its URL (the upstream's name for it `m`, a
    2048-token window, counted by the estimate), and the embedded model off."""
    entries = "".join(
        f'  - id: {model_id}\n    upstream:\n      base_urls: ["{url}"]\n      model: m\n'
        "      context_window: 2048\n      tokenizer: estimate\n"
        for model_id, url in urls.items()
    )
    return f"models:\n{entries}embedded: false\n"


@contextmanager
def upstream_front(
    folder: Path,
    models: str,
    *,
    policy_reload_seconds: float = 0,
    tracer_provider: TracerProvider | None = None,
) -> Iterator[UpstreamFront]:
    """Bastion on `folder` under the default policy and the models file `models`, served on
    a thread until the block ends."""
    policy_dir = folder / "policies"
    policy_dir.mkdir()
    shutil.copy(REPO_ROOT / "policies" / "default.yaml", policy_dir / "default.yaml")
    models_file = folder / "models.yaml"
    models_file.write_text(models)
    settings = Settings(
        data_dir=folder / "data",
        port=free_port(),
        policy_dir=policy_dir,
        policy_reload_seconds=policy_reload_seconds,
        models_file=models_file,
        sample_corpus=None,
    )
    services = load_services(settings)  # the embedded engine is off: nothing to load
    secret, _ = create_key(services.sessions, settings.default_tenant, "user")
    with serve_in_thread(settings, services, tracer_provider) as base_url:
        yield UpstreamFront(base_url, settings, services, secret)

"""The models file (`BASTION_MODELS_FILE`): which models the gateway serves besides its
embedded one, and the upstream servers behind each, validated as strictly as policies
(errors name line and field)."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from engine import UpstreamConfig, UpstreamTimeouts
from gateway.yaml_file import YamlFileError, issue_at, locate, read_yaml

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_URL = re.compile(r"https?://[^\s/?#]+(/[^\s?#]*)?")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Timeouts(_Strict):
    """Seconds: connecting, waiting for the first token, between two chunks, the whole answer."""

    connect: float = Field(default=5.0, gt=0)
    first_token: float = Field(default=60.0, gt=0)
    idle: float = Field(default=30.0, gt=0)
    total: float = Field(default=600.0, gt=0)


class Resilience(_Strict):
    """How the servers of a model are tried: retries before the first token, the health
    checks' beat, and each server's circuit breaker."""

    max_retries: int = Field(
        default=2, ge=0, description="Further tries (the next server first) before the first token."
    )
    health_interval_s: float = Field(default=10.0, gt=0, description="Seconds between checks.")
    circuit_failures: int = Field(
        default=5, ge=1, description="Failures in a row that open a server's circuit."
    )
    circuit_reset_s: float = Field(
        default=30.0, gt=0, description="Seconds an open circuit skips its server."
    )


class Upstream(_Strict):
    """The OpenAI-compatible servers (vLLM, SGLang, NIM, TGI, llama-server) behind a model."""

    base_urls: list[str] = Field(min_length=1, description="Servers' URLs, ending in /v1.")
    model: str = Field(min_length=1, description="The upstream's own name for the model.")
    api_key_env: str | None = Field(
        default=None, description="Environment variable holding the bearer key."
    )
    timeouts: Timeouts = Field(default_factory=Timeouts)
    resilience: Resilience = Field(default_factory=Resilience)
    max_concurrency: int = Field(default=64, ge=1, description="Streams at once per server.")
    context_window: int | None = Field(
        default=None, ge=16, description="Tokens; null reads it from the upstream."
    )
    tokenizer: Literal["upstream", "local", "estimate"] = "upstream"
    tokenizer_path: Path | None = Field(
        default=None, description="A tokenizer folder, for `tokenizer: local`."
    )
    forward_cache_salt: bool = Field(
        default=False, description="Send the tenant as vLLM's `cache_salt` (prefix isolation)."
    )

    @field_validator("base_urls")
    @classmethod
    def _http_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not _URL.fullmatch(url):
                raise ValueError(f"{url!r} is not an http(s) URL")
        if len(set(urls)) != len(urls):
            raise ValueError("a URL is listed twice")
        return [url.rstrip("/") for url in urls]

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, name: str | None) -> str | None:
        if name is not None and not _ENV_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not an environment variable name")
        return name

    @model_validator(mode="after")
    def _local_tokenizer(self) -> Upstream:
        if self.tokenizer == "local" and self.tokenizer_path is None:
            raise ValueError("tokenizer: local needs tokenizer_path")
        return self


class UpstreamModel(_Strict):
    id: str = Field(min_length=1, description="What clients send as `model`.")
    upstream: Upstream


class ModelsFile(_Strict):
    """The models a gateway serves: upstream ones, and whether the embedded one is served."""

    models: list[UpstreamModel] = Field(default_factory=list)
    embedded: bool = Field(default=True, description="false stops serving the embedded model.")


class ModelsFileError(YamlFileError):
    """A models file that cannot be used, with every problem located in it."""


@dataclass(frozen=True, slots=True)
class LoadedModels:
    """A validated models file, its upstream configs, and its version (SHA-256 of its bytes)."""

    file: ModelsFile
    upstreams: tuple[UpstreamConfig, ...]
    version: str
    path: Path

    @property
    def embedded(self) -> bool:
        return self.file.embedded


def load_models_file(
    path: Path, *, embedded_id: str | None = None, check_env: bool = True
) -> LoadedModels:
    """Read and validate `path`; raise ModelsFileError naming each problem's line.

    `embedded_id` (the in-process model's id) may not be reused by an upstream model.
    `check_env` also requires each `api_key_env` to be set (at load; `bastion models
    check` runs where the keys are not).
    """
    source = read_yaml(path, ModelsFileError)
    try:
        file = ModelsFile.model_validate(source.data)
    except ValidationError as exc:
        issues = [locate([source], error, ModelsFile) for error in exc.errors()]
        raise ModelsFileError(path, issues) from exc
    issues = []
    seen: set[str] = set()
    for index, model in enumerate(file.models):
        at_id = ("models", index, "id")
        if model.id in seen:
            issues.append(issue_at(source, at_id, f"{model.id!r} is listed twice"))
        elif model.id == embedded_id and file.embedded:
            issues.append(issue_at(source, at_id, f"{model.id!r} is the embedded model's id"))
        seen.add(model.id)
        env = model.upstream.api_key_env
        if check_env and env is not None and not os.environ.get(env):
            issues.append(
                issue_at(
                    source,
                    ("models", index, "upstream", "api_key_env"),
                    f"the environment variable {env} is not set",
                )
            )
    if issues:
        raise ModelsFileError(path, issues)
    upstreams = tuple(upstream_config(model) for model in file.models)
    return LoadedModels(file, upstreams, hashlib.sha256(source.raw).hexdigest(), path)


def upstream_config(model: UpstreamModel) -> UpstreamConfig:
    """What the upstream engine reads, from one entry of the file."""
    upstream = model.upstream
    return UpstreamConfig(
        model_id=model.id,
        base_urls=tuple(upstream.base_urls),
        upstream_model=upstream.model,
        api_key_env=upstream.api_key_env,
        timeouts=UpstreamTimeouts(**upstream.timeouts.model_dump()),
        max_concurrency=upstream.max_concurrency,
        context_window=upstream.context_window,
        tokenizer=upstream.tokenizer,
        tokenizer_path=upstream.tokenizer_path,
        forward_cache_salt=upstream.forward_cache_salt,
        max_retries=upstream.resilience.max_retries,
        circuit_failures=upstream.resilience.circuit_failures,
        circuit_reset_s=upstream.resilience.circuit_reset_s,
        health_interval_s=upstream.resilience.health_interval_s,
    )

"""Policies: YAML an admin edits, validated strictly, with errors that name line and field.

A policy may `extends:` another policy of the same folder by name; it then overrides only
what it names (mappings merge key by key, lists and values replace). The version is the
SHA-256 over the bytes of the file and of every file it extends.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gateway.yaml_file import FileIssue, YamlFileError, YamlSource, issue_at, locate, read_yaml
from guardrails.config import InputGuardrailsConfig, OutputGuardrailsConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Binding(_Strict):
    """Which callers this policy judges: whole tenants, or single API keys (by key id)."""

    tenants: list[str] = Field(default_factory=list)
    keys: list[str] = Field(default_factory=list)


class RetrievalSettings(_Strict):
    enabled: bool = True
    collections: list[str] = Field(default_factory=lambda: ["docs"])
    top_k: int = Field(default=3, ge=1, le=50)
    min_score: float = Field(default=0.25, ge=-1.0, le=1.0)


class ModelLimits(_Strict):
    max_tokens: int = Field(default=512, ge=1, description="Most tokens an answer may have.")
    max_choices: int = Field(
        default=4, ge=1, le=128, description="Most answers (`n`) one request may ask for."
    )
    min_temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    max_temperature: float = Field(default=2.0, ge=0.0, le=2.0)
    system_prompt: str = "You are a helpful assistant."
    allow_tools: bool = True
    allowed_tools: list[str] | None = Field(
        default=None, description="Tool names a request may declare; null allows any."
    )
    allowed_models: list[str] | None = Field(
        default=None,
        description="Model ids (`model` in a request, as `/v1/models` lists them) this "
        "policy's callers may use; null allows every served model.",
    )
    speculative_decoding: bool = Field(
        default=True,
        description="Let the engine verify drafts of the answer taken from the prompt "
        "(prompt-lookup speculative decoding): the same tokens, sooner, on answers that "
        "quote their sources. Takes effect where the engine has it on "
        "(`BASTION_SPECULATIVE_TOKENS`).",
    )

    @model_validator(mode="after")
    def _temperature_range(self) -> ModelLimits:
        if self.min_temperature > self.max_temperature:
            raise ValueError("min_temperature must not exceed max_temperature")
        return self


class AuditSettings(_Strict):
    store_content: bool = Field(
        default=True, description="Keep the redacted prompt and answer text in the audit log."
    )
    retention_days: int = Field(default=365, ge=1, description="Days before records purge.")


class RateLimits(_Strict):
    """Per API key and per tenant, per minute; null means no limit."""

    key_requests_per_minute: int | None = Field(default=None, ge=1)
    key_tokens_per_minute: int | None = Field(default=None, ge=1)
    tenant_requests_per_minute: int | None = Field(default=None, ge=1)
    tenant_tokens_per_minute: int | None = Field(default=None, ge=1)


class StructuredOutputLimits(_Strict):
    """Limits on the JSON Schemas clients send (`response_format`, tool parameters):
    a schema past any of them is refused with 400 before it is compiled."""

    max_schema_bytes: int = Field(
        default=65_536, ge=256, description="Largest schema, as compact JSON, in bytes."
    )
    # jsonschema's own schema check recurses: 64 levels stay far from Python's limit.
    max_depth: int = Field(
        default=32, ge=2, le=64, description="Deepest nesting of objects and arrays in a schema."
    )
    max_properties: int = Field(
        default=256,
        ge=1,
        description="Most properties (and patternProperties) a schema may declare, all "
        "objects together.",
    )
    max_enum_values: int = Field(
        default=1024, ge=1, description="Most `enum` values a schema may list, all enums together."
    )
    max_pattern_length: int = Field(
        default=1000, ge=1, description="Longest `pattern` (or patternProperties key)."
    )
    max_required_count: int = Field(
        default=1000,
        ge=0,
        description="Largest minLength, minItems or minProperties: an answer must produce "
        "that many before it may end.",
    )
    max_compile_cost: int = Field(
        default=40_000,
        ge=1000,
        description="Most estimated grammar-compile work (patterns, formats, ranges, enum "
        "text, properties), in units of about 13 µs of one core.",
    )
    allow_recursive_refs: bool = Field(
        default=True,
        description="Allow a `$ref` that refers back to a schema containing it (trees, "
        "linked lists).",
    )


class GuardrailsCheckSettings(_Strict):
    """Who besides admins may try this policy's checks on a text
    (`POST /v1/guardrails/check`)."""

    allow_user: bool = Field(
        default=False,
        description="Let `user` keys bound to this policy call the check endpoint (admins "
        "always may).",
    )


class Policy(_Strict):
    """The checks, retrieval and model limits that apply to a tenant's requests."""

    name: str
    description: str = ""
    extends: str | None = Field(default=None, description="Name of the policy this extends.")
    applies_to: Binding = Field(default_factory=Binding)
    input: InputGuardrailsConfig = Field(default_factory=InputGuardrailsConfig)
    output: OutputGuardrailsConfig = Field(default_factory=OutputGuardrailsConfig)
    retrieval: RetrievalSettings = Field(default_factory=RetrievalSettings)
    model: ModelLimits = Field(default_factory=ModelLimits)
    audit: AuditSettings = Field(default_factory=AuditSettings)
    rate_limits: RateLimits = Field(default_factory=RateLimits)
    structured_output: StructuredOutputLimits = Field(default_factory=StructuredOutputLimits)
    guardrails_check: GuardrailsCheckSettings = Field(
        default_factory=GuardrailsCheckSettings,
        description="Access to the check endpoint, which runs this policy's checks on a "
        "text without generating.",
    )


@dataclass(frozen=True, slots=True)
class LoadedPolicy:
    """A validated policy and its version (SHA-256 over its file and those it extends)."""

    policy: Policy
    version: str
    path: Path


# A problem in a policy file, and the error that lists them (shared with the models file).
PolicyIssue = FileIssue


class PolicyError(YamlFileError):
    """A policy file that cannot be used, with every problem located in its file."""


def load_policy(path: Path) -> LoadedPolicy:
    """Read and validate a policy file (and those it extends); raise PolicyError."""
    chain = _read_chain(path)
    merged: dict[str, Any] = {}
    for source in reversed(chain):
        merged = _deep_merge(merged, source.data)
    merged["extends"] = chain[0].data.get("extends")
    try:
        policy = Policy.model_validate(merged)
    except ValidationError as exc:
        raise PolicyError(path, [locate(chain, err, Policy) for err in exc.errors()]) from exc
    digest = hashlib.sha256()
    for source in chain:
        digest.update(hashlib.sha256(source.raw).digest())
    return LoadedPolicy(policy, digest.hexdigest(), path)


def policy_json_schema() -> dict[str, Any]:
    """The JSON Schema of a policy file, for editors (yaml-language-server) and docs."""
    schema = Policy.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "Bastion policy"
    return schema


def _read_chain(path: Path) -> list[YamlSource]:
    """The file and its ancestors, child first; cycles and missing parents are errors."""
    chain: list[YamlSource] = []
    seen: set[Path] = set()
    current: Path | None = path
    while current is not None:
        resolved = current.resolve()
        if resolved in seen:
            raise PolicyError(path, [PolicyIssue(None, None, "extends", "extends itself (cycle)")])
        seen.add(resolved)
        source = read_yaml(current, PolicyError)
        chain.append(source)
        parent = source.data.get("extends")
        if parent is None:
            current = None
        elif not isinstance(parent, str) or not parent:
            raise PolicyError(current, [issue_at(source, ("extends",), "must be a policy name")])
        else:
            current = current.parent / f"{parent}.yaml"
            if not current.is_file():
                raise PolicyError(
                    source.path,
                    [issue_at(source, ("extends",), f"no policy named {parent!r} beside it")],
                )
    return chain


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged

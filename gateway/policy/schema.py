"""Policies: YAML an admin edits, validated strictly, with errors that name line and field.

A policy may `extends:` another policy of the same folder by name; it then overrides only
what it names (mappings merge key by key, lists and values replace). The version is the
SHA-256 over the bytes of the file and of every file it extends.
"""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

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


@dataclass(frozen=True, slots=True)
class PolicyIssue:
    line: int | None
    column: int | None
    field: str
    message: str
    path: Path | None = None

    def __str__(self) -> str:
        where = f"line {self.line}, column {self.column}" if self.line else "(no position)"
        return f"{where}: {self.field}: {self.message}"


class PolicyError(ValueError):
    """A policy file that cannot be used, with every problem located in its file."""

    def __init__(self, path: Path, issues: list[PolicyIssue]) -> None:
        self.path = path
        self.issues = issues
        super().__init__("\n".join(f"{issue.path or path}: {issue}" for issue in issues))


@dataclass(frozen=True, slots=True)
class _Source:
    path: Path
    raw: bytes
    data: dict[str, Any]
    root: yaml.Node | None


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
        raise PolicyError(path, [_locate(chain, err) for err in exc.errors()]) from exc
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


def _read_chain(path: Path) -> list[_Source]:
    """The file and its ancestors, child first; cycles and missing parents are errors."""
    chain: list[_Source] = []
    seen: set[Path] = set()
    current: Path | None = path
    while current is not None:
        resolved = current.resolve()
        if resolved in seen:
            raise PolicyError(path, [PolicyIssue(None, None, "extends", "extends itself (cycle)")])
        seen.add(resolved)
        source = _read(current)
        chain.append(source)
        parent = source.data.get("extends")
        if parent is None:
            current = None
        elif not isinstance(parent, str) or not parent:
            raise PolicyError(current, [_issue_at(source, ("extends",), "must be a policy name")])
        else:
            current = current.parent / f"{parent}.yaml"
            if not current.is_file():
                raise PolicyError(
                    source.path,
                    [_issue_at(source, ("extends",), f"no policy named {parent!r} beside it")],
                )
    return chain


def _read(path: Path) -> _Source:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PolicyError(path, [PolicyIssue(None, None, "(file)", str(exc), path)]) from exc
    text = raw.decode("utf-8", errors="replace")
    try:
        data = yaml.safe_load(text)
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        column = mark.column + 1 if mark else None
        raise PolicyError(path, [PolicyIssue(line, column, "(yaml)", str(exc), path)]) from exc
    if not isinstance(data, dict):
        raise PolicyError(path, [PolicyIssue(1, 1, "(root)", "expected a mapping", path)])
    return _Source(path, raw, data, root)


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _locate(chain: list[_Source], error: Any) -> PolicyIssue:
    """Point at the error in the first file of the chain that holds that field."""
    loc = tuple(error["loc"])
    message = str(error["msg"])
    if error["type"] == "extra_forbidden":
        message = "unknown key" + _suggestion(loc)
    elif error["type"] == "missing":
        message = "required field is missing"
    at_key = error["type"] == "extra_forbidden"
    for source in chain:
        if _node_at(source.root, loc) is not None:
            return _issue_at(source, loc, message, at_key)
    return _issue_at(chain[0], loc, message, at_key)


def _issue_at(
    source: _Source, loc: tuple[Any, ...], message: str, at_key: bool = False
) -> PolicyIssue:
    """Locate `loc` in the file: its value, or its key for an unknown key."""
    field = ".".join(str(p) for p in loc) or "(root)"
    node = (_key_node(source.root, loc) if at_key else None) or _nearest_node(source.root, loc)
    if node is None:
        return PolicyIssue(None, None, field, message, source.path)
    return PolicyIssue(
        node.start_mark.line + 1, node.start_mark.column + 1, field, message, source.path
    )


def _suggestion(loc: tuple[Any, ...]) -> str:
    allowed = _fields_at(Policy, loc[:-1])
    close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
    if close:
        return f"; did you mean '{close[0]}'?"
    return f"; expected one of: {', '.join(allowed)}" if allowed else ""


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        field = current.model_fields.get(str(part))
        if field is None:
            return []
        current = _model_in(field.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _model_in(annotation: Any) -> Any:
    """The BaseModel inside `X`, `list[X]` or `X | None`, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) is not None:
        for arg in get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def _child(node: yaml.Node | None, part: str | int) -> yaml.Node | None:
    # PyYAML types a node's `value` as Any: a mapping holds (key, value) node pairs, a
    # sequence holds nodes.
    if isinstance(node, yaml.MappingNode):
        pairs: list[tuple[yaml.Node, yaml.Node]] = node.value
        for key, value in pairs:
            if key.value == part:
                return value
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
        items: list[yaml.Node] = node.value
        return items[part]
    return None


def _node_at(root: yaml.Node | None, loc: tuple[Any, ...]) -> yaml.Node | None:
    node = root
    for part in loc:
        node = _child(node, part)
        if node is None:
            return None
    return node


def _nearest_node(root: yaml.Node | None, loc: tuple[Any, ...]) -> yaml.Node | None:
    node = root
    for part in loc:
        child = _child(node, part)
        if child is None:
            break
        node = child
    return node


def _key_node(root: yaml.Node | None, loc: tuple[Any, ...]) -> yaml.Node | None:
    """The key of the last path element, so that the error points at the key itself."""
    if not loc or not isinstance(loc[-1], str):
        return None
    parent = _node_at(root, loc[:-1])
    if isinstance(parent, yaml.MappingNode):
        pairs: list[tuple[yaml.Node, yaml.Node]] = parent.value
        for key, _ in pairs:
            if key.value == loc[-1]:
                return key
    return None

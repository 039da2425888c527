"""Policies: YAML an admin edits, validated strictly, with errors that name line and field."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from guardrails.config import InputGuardrailsConfig, OutputGuardrailsConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RetrievalSettings(_Strict):
    enabled: bool = True
    collections: list[str] = Field(default_factory=lambda: ["docs"])
    top_k: int = Field(default=3, ge=1, le=50)
    min_score: float = Field(default=0.25, ge=-1.0, le=1.0)


class ModelLimits(_Strict):
    max_tokens: int = Field(default=512, ge=1)
    system_prompt: str = "You are a helpful assistant."
    allow_tools: bool = True


class AuditSettings(_Strict):
    store_content: bool = Field(
        default=True, description="Keep the redacted prompt and answer text in the audit log."
    )


class Policy(_Strict):
    """The checks, retrieval and model limits that apply to a tenant's requests."""

    name: str
    description: str = ""
    input: InputGuardrailsConfig = Field(default_factory=InputGuardrailsConfig)
    output: OutputGuardrailsConfig = Field(default_factory=OutputGuardrailsConfig)
    retrieval: RetrievalSettings = Field(default_factory=RetrievalSettings)
    model: ModelLimits = Field(default_factory=ModelLimits)
    audit: AuditSettings = Field(default_factory=AuditSettings)


@dataclass(frozen=True, slots=True)
class LoadedPolicy:
    """A validated policy and its version: the SHA-256 of the file's bytes."""

    policy: Policy
    version: str
    path: Path


@dataclass(frozen=True, slots=True)
class PolicyIssue:
    line: int | None
    column: int | None
    field: str
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}, column {self.column}" if self.line else "(no position)"
        return f"{where}: {self.field}: {self.message}"


class PolicyError(ValueError):
    """A policy file that cannot be used, with every problem located in the file."""

    def __init__(self, path: Path, issues: list[PolicyIssue]) -> None:
        self.path = path
        self.issues = issues
        super().__init__("\n".join(f"{path}: {issue}" for issue in issues))


def load_policy(path: Path) -> LoadedPolicy:
    """Read and validate a policy file; raise PolicyError naming line, column and field."""
    raw = path.read_bytes()
    text = raw.decode("utf-8", errors="replace")
    try:
        data = yaml.safe_load(text)
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        column = mark.column + 1 if mark else None
        raise PolicyError(path, [PolicyIssue(line, column, "(yaml)", str(exc))]) from exc
    if not isinstance(data, dict):
        raise PolicyError(path, [PolicyIssue(1, 1, "(root)", "expected a mapping of settings")])
    try:
        policy = Policy.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(path, [_locate(root, err) for err in exc.errors()]) from exc
    return LoadedPolicy(policy, hashlib.sha256(raw).hexdigest(), path)


def _locate(root: yaml.Node | None, error: Any) -> PolicyIssue:
    loc = tuple(error["loc"])
    node = root
    for part in loc:
        child = _child(node, part)
        if child is None:
            break
        node = child
    field = ".".join(str(p) for p in loc) or "(root)"
    message = str(error["msg"])
    if error["type"] == "extra_forbidden":
        message = "unknown key"
        if loc and isinstance(loc[-1], str):
            node = _key_node(root, loc) or node
    if node is None:
        return PolicyIssue(None, None, field, message)
    return PolicyIssue(node.start_mark.line + 1, node.start_mark.column + 1, field, message)


def _child(node: yaml.Node | None, part: str | int) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if key.value == part:
                return value
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
        return node.value[part]
    return None


def _key_node(root: yaml.Node | None, loc: tuple[Any, ...]) -> yaml.Node | None:
    """For an unknown key, point at the key itself rather than at its value."""
    parent = root
    for part in loc[:-1]:
        parent = _child(parent, part)
    if isinstance(parent, yaml.MappingNode):
        for key, _ in parent.value:
            if key.value == loc[-1]:
                return key
    return None

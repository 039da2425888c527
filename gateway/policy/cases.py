"""`policy test`: run example requests through the real guardrails and compare verdicts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gateway.policy.schema import LoadedPolicy, PolicyError, PolicyIssue

Expected = Literal["allow", "redact", "block", "flag"]


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"] = "user"
    content: str


class PolicyCase(BaseModel):
    """One example request and the verdict the policy must give it."""

    model_config = ConfigDict(extra="forbid")

    name: str
    prompt: str | None = None
    messages: list[_Message] = Field(default_factory=list)
    expect: Expected
    check: str | None = Field(
        default=None, description="Compare this check's verdict instead of the overall one."
    )

    @model_validator(mode="after")
    def _one_input(self) -> PolicyCase:
        if (self.prompt is None) == (not self.messages):
            raise ValueError("give exactly one of 'prompt' or 'messages'")
        return self

    @property
    def texts(self) -> list[str]:
        return [self.prompt] if self.prompt is not None else [m.content for m in self.messages]

    @property
    def last_user_text(self) -> str:
        if self.prompt is not None:
            return self.prompt
        return next((m.content for m in reversed(self.messages) if m.role == "user"), "")


class _CaseFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cases: list[PolicyCase] = Field(min_length=1)


@dataclass(frozen=True, slots=True)
class CaseResult:
    case: PolicyCase
    actual: str
    evidence: str

    @property
    def passed(self) -> bool:
        return self.actual == self.case.expect


def load_cases(path: Path) -> list[PolicyCase]:
    try:
        data = yaml.safe_load(path.read_text())
        return _CaseFile.model_validate(data).cases
    except yaml.YAMLError as exc:
        raise PolicyError(path, [PolicyIssue(None, None, "(yaml)", str(exc), path)]) from exc
    except ValidationError as exc:
        issues = [
            PolicyIssue(None, None, ".".join(map(str, e["loc"])), e["msg"], path)
            for e in exc.errors()
        ]
        raise PolicyError(path, issues) from exc


# The guardrail check a case runs: texts and topic text in, verdicts and blocking out.
InputCheck = Callable[[list[str], str], tuple[list[tuple[str, str, str]], str | None]]


def run_cases(cases: list[PolicyCase], check: InputCheck) -> list[CaseResult]:
    """Each case's actual verdict: the named check's action, or the overall outcome."""
    results = []
    for case in cases:
        verdicts, blocking = check(case.texts, case.last_user_text)
        if case.check is not None:
            found = [
                (action, evidence) for name, action, evidence in verdicts if name == case.check
            ]
            actual, evidence = found[0] if found else ("allow", "check did not run")
        elif blocking is not None:
            actual, evidence = "block", blocking
        elif any(action == "redact" for _, action, _ in verdicts):
            actual = "redact"
            evidence = "; ".join(e for _, a, e in verdicts if a == "redact")
        else:
            actual, evidence = "allow", ""
        results.append(CaseResult(case, actual, evidence))
    return results


def guardrail_check_for(loaded: LoadedPolicy) -> InputCheck:
    """The real input guardrails of a policy (loads presidio and MiniLM)."""
    from gateway.policy.runtime import build_policy_runtime
    from retrieval import Embedder

    runtime = build_policy_runtime(loaded, Embedder.load().for_requests())

    def check(texts: list[str], topic_text: str) -> tuple[list[tuple[str, str, str]], str | None]:
        result = runtime.input_guardrails.check(texts, topic_text)
        verdicts: list[tuple[str, str, str]] = [
            (v.check, v.action, "; ".join(v.evidence)) for v in result.verdicts
        ]
        blocking = result.blocking
        return verdicts, None if blocking is None else f"{blocking.check}: " + "; ".join(
            blocking.evidence
        )

    return check

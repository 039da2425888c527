"""A loaded policy with the guardrails built from it, and the registry of them that a
running gateway serves from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gateway.audit.entries import admin_action_entry
from gateway.audit.log import AuditEntry, AuditLog
from gateway.http.errors import ApiError
from gateway.keys.store import KeyIdentity
from gateway.policy.registry import NoPolicyError, PolicyChange, PolicyRegistry
from gateway.policy.schema import LoadedPolicy
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
from retrieval import Embedder


@dataclass
class PolicyRuntime:
    """A policy together with the guardrail objects built from it."""

    loaded: LoadedPolicy
    input_guardrails: InputGuardrails
    output: OutputGuardrails
    untrusted_text: InjectionDetector


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
    folder: Path, embedder: Embedder, audit: AuditLog
) -> PolicyRegistry[PolicyRuntime]:
    """Load every policy of the folder; each change is audited from then on."""
    registry: PolicyRegistry[PolicyRuntime] = PolicyRegistry(
        folder,
        lambda loaded: build_policy_runtime(loaded, embedder),
        on_change=lambda change: audit.record(policy_change_entry(change)),
    )
    registry.reload(actor="startup")
    return registry


def policy_change_entry(change: PolicyChange) -> AuditEntry:
    return admin_action_entry(
        event="policy.reload_failed" if change.error else "policy.reloaded",
        actor=change.actor,
        endpoint="policy-watcher",
        policy_version=change.new_version or change.old_version,
        outcome="rejected" if change.error else "ok",
        details={
            "path": str(change.path),
            "policy": change.name,
            "old_version": change.old_version,
            "new_version": change.new_version,
            "error": change.error,
        },
    )


def policy_for(policies: PolicyRegistry[PolicyRuntime], identity: KeyIdentity) -> PolicyRuntime:
    """Fail closed: a caller with no bound policy is refused, never served unchecked."""
    try:
        return policies.for_identity(identity)
    except NoPolicyError as exc:
        raise ApiError(403, str(exc), type="permission_error", code="no_policy") from exc

"""Policy models for the guardrail checks, validated when a policy is loaded."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from guardrails.verdict import CheckMode

DEFAULT_PII_ENTITIES: tuple[str, ...] = (
    "EMAIL_ADDRESS",
    "PHONE_NUMBER",
    "CREDIT_CARD",
    "US_SSN",
    "IBAN_CODE",
    "IP_ADDRESS",
)


class InjectionConfig(BaseModel):
    """Prompt-injection detection; `extra_patterns` run against the normalised text."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    mode: CheckMode = "enforce"
    extra_patterns: list[str] = Field(default_factory=list)

    @field_validator("extra_patterns")
    @classmethod
    def _patterns_compile(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"extra pattern {pattern!r} is not a valid regex: {exc}") from exc
        return patterns


class PiiConfig(BaseModel):
    """Which presidio entities to redact, and the minimum score that counts as a finding."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    mode: CheckMode = "enforce"
    entities: list[str] = Field(default_factory=lambda: list(DEFAULT_PII_ENTITIES))
    score_threshold: float = Field(default=0.4, ge=0.0, le=1.0)


class Topic(BaseModel):
    """An allowed topic, described in words and optionally by example questions."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str
    examples: list[str] = Field(default_factory=list)


class TopicConfig(BaseModel):
    """Topic allow-list; `threshold` is the minimum cosine similarity to the closest topic."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    mode: CheckMode = "enforce"
    allowed: list[Topic] = Field(default_factory=list)
    threshold: float = Field(default=0.25, ge=-1.0, le=1.0)


class InputGuardrailsConfig(BaseModel):
    """Checks run on a request before it reaches the model."""

    model_config = ConfigDict(extra="forbid")

    injection: InjectionConfig = Field(default_factory=InjectionConfig)
    pii: PiiConfig = Field(default_factory=PiiConfig)
    topics: TopicConfig = Field(default_factory=TopicConfig)


class OutputGuardrailsConfig(BaseModel):
    """Checks run on the model's answer; `stream_window_chars` is the streaming hold-back."""

    model_config = ConfigDict(extra="forbid")

    pii: PiiConfig = Field(default_factory=PiiConfig)
    tool_calls_mode: CheckMode = "enforce"
    stream_window_chars: int = Field(default=48, ge=0)

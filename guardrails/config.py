"""Policy models for the guardrail checks, validated when a policy is loaded."""

from __future__ import annotations

import re
from typing import Literal

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

# What happens to a PII entity: refuse the request, replace it with a typed placeholder,
# replace it reversibly (the answer gets the original back), or let it through.
PiiAction = Literal["block", "redact", "pseudonymize", "allow"]

_ENTITY_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


def _check_regexes(patterns: list[str]) -> list[str]:
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"pattern {pattern!r} is not a valid regex: {exc}") from exc
    return patterns


class _Check(BaseModel):
    """Fields every check shares: on/off, mode, and what an internal error means.

    `fail_closed`: an exception inside the check blocks (enforce mode) instead of passing.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    mode: CheckMode = "enforce"
    fail_closed: bool = True


class InjectionConfig(_Check):
    """Prompt-injection detection: built-in and `extra_patterns` regexes on the normalised
    text, plus the shipped classifier when an embedder is available.

    `classifier_threshold` None uses the threshold stored with the classifier's weights.
    """

    extra_patterns: list[str] = Field(default_factory=list)
    classifier: bool = True
    classifier_threshold: float | None = Field(default=None, ge=0.0, le=1.0)

    _patterns_compile = field_validator("extra_patterns")(_check_regexes)


class CustomRecognizer(BaseModel):
    """A policy-defined PII entity: regexes, plus context words that raise its score."""

    model_config = ConfigDict(extra="forbid")

    entity: str
    patterns: list[str] = Field(min_length=1)
    context: list[str] = Field(default_factory=list)
    score: float = Field(default=0.6, ge=0.0, le=1.0)

    _patterns_compile = field_validator("patterns")(_check_regexes)

    @field_validator("entity")
    @classmethod
    def _entity_name(cls, entity: str) -> str:
        if not _ENTITY_NAME.match(entity):
            raise ValueError(f"entity {entity!r} must be UPPER_SNAKE_CASE, e.g. EMPLOYEE_ID")
        return entity


class PiiConfig(_Check):
    """Which presidio entities to look for, the minimum score that counts, and per-entity
    actions (`default_action` for entities not listed in `actions`).

    `countries` selects presidio's country-specific recognizers (e.g. "us", "uk") and the
    countries whose national phone-number formats are read (international "+44 ..."
    numbers are found whatever it says); it takes effect through `build_analyzer(countries)`.
    Defaults measured by `bench_pii_precision` in bench/guardrails_pii.py: adding "uk" found
    25 of 30 UK national-format numbers (0 without) and no false finding on 50 harmless
    business sentences and 300 Cranfield abstracts, for 0.6 ms more a 1,000-character
    prompt (1.9 -> 2.5 ms p50), so it is on. PERSON and LOCATION stay
    off: they flagged 10% and 14% of the business sentences (team and product names such
    as "Customer Success", "Jenkins") and 19% and 4% of the abstracts, and spaCy's NER they
    need costs about 6 ms a sentence and 40 ms a 1,000-character text, over the 25 ms
    budget of all input checks together. Add them where names matter more than that.
    """

    entities: list[str] = Field(default_factory=lambda: list(DEFAULT_PII_ENTITIES))
    score_threshold: float = Field(default=0.4, ge=0.0, le=1.0)
    default_action: PiiAction = "redact"
    actions: dict[str, PiiAction] = Field(default_factory=dict)
    custom_recognizers: list[CustomRecognizer] = Field(default_factory=list)
    countries: list[str] = Field(default_factory=lambda: ["us", "uk"])

    def action_for(self, entity: str) -> PiiAction:
        return self.actions.get(entity, self.default_action)

    @property
    def all_entities(self) -> list[str]:
        """Configured entities plus those of the custom recognizers."""
        custom = [r.entity for r in self.custom_recognizers if r.entity not in self.entities]
        return [*self.entities, *dict.fromkeys(custom)]


class Topic(BaseModel):
    """A topic, described in words and optionally by example questions."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str
    examples: list[str] = Field(default_factory=list)


class TopicConfig(_Check):
    """Topic allow-list and deny-list by embedding similarity.

    A request is off-topic when `allowed` is non-empty and its best cosine similarity to
    an allowed topic (its description, each item the description lists, its examples) is
    below `threshold`; it is denied when its similarity to a denied topic reaches
    `deny_threshold`.
    """

    enabled: bool = False
    allowed: list[Topic] = Field(default_factory=list)
    threshold: float = Field(default=0.2, ge=-1.0, le=1.0)
    denied: list[Topic] = Field(default_factory=list)
    deny_threshold: float = Field(default=0.5, ge=-1.0, le=1.0)


class InputGuardrailsConfig(BaseModel):
    """Checks run on a request before it reaches the model."""

    model_config = ConfigDict(extra="forbid")

    injection: InjectionConfig = Field(default_factory=InjectionConfig)
    pii: PiiConfig = Field(default_factory=PiiConfig)
    topics: TopicConfig = Field(default_factory=TopicConfig)

    def any_enabled(self) -> bool:
        """Whether any input check is on; with none, the input guardrails only record that."""
        return self.injection.enabled or self.pii.enabled or self.topics.enabled


class SecretsConfig(_Check):
    """Credentials in the answer (API keys, tokens, private keys, connection-string
    passwords); `extra_patterns` are more regexes whose whole match is a secret."""

    extra_patterns: list[str] = Field(default_factory=list)

    _patterns_compile = field_validator("extra_patterns")(_check_regexes)


class LeakConfig(_Check):
    """System-prompt and canary leaks: any `canaries` string, or a run of `ngram_words`
    consecutive words of the system prompt, in the answer."""

    canaries: list[str] = Field(default_factory=list)
    ngram_words: int = Field(default=8, ge=3)


class OutputGuardrailsConfig(BaseModel):
    """Checks run on the model's answer. While streaming, text goes out as soon as no check
    can still need it, and at the latest `stream_window_chars` behind the answer's end."""

    model_config = ConfigDict(extra="forbid")

    pii: PiiConfig = Field(default_factory=PiiConfig)
    secrets: SecretsConfig = Field(default_factory=SecretsConfig)
    leaks: LeakConfig = Field(default_factory=LeakConfig)
    tool_calls_mode: CheckMode = "enforce"
    stream_window_chars: int = Field(default=48, ge=0)

"""The check request and its typed response (the OpenAPI document shows both)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gateway.chat.schemas import Message

Direction = Literal["input", "output"]
Decision = Literal["allow", "redact", "block"]


class GuardrailsCheckRequest(BaseModel):
    """A text (or a chat's messages) to run the caller's policy checks on."""

    model_config = ConfigDict(extra="forbid")

    text: str | None = Field(default=None, description="The text to check.")
    messages: list[Message] | None = Field(
        default=None,
        min_length=1,
        description="Instead of `text`: messages in the chat shape, checked as a chat "
        "request's are (input direction only).",
    )
    direction: Direction = Field(
        default="input",
        description="`input`: the checks a prompt gets; `output`: those an answer gets.",
    )
    checks: list[str] | None = Field(
        default=None,
        min_length=1,
        description="Only report these checks' verdicts (all of the direction's checks still "
        "run, so that the text and decision are the chat path's). Input: prompt_injection, "
        "pii, topic; output: prompt_leak, secrets, pii.",
    )

    @model_validator(mode="after")
    def _one_subject(self) -> GuardrailsCheckRequest:
        if (self.text is None) == (self.messages is None):
            raise ValueError("send exactly one of 'text' and 'messages'")
        if self.text is not None and not self.text.strip():
            raise ValueError("'text' must not be empty")
        if self.messages is not None and self.direction == "output":
            raise ValueError("the output direction checks one answer: send 'text'")
        return self


class Span(BaseModel):
    """Character offsets `[start, end)` into the checked text (message `message`)."""

    message: int = Field(description="Index of the message; 0 for `text`.")
    start: int
    end: int


class CheckVerdict(BaseModel):
    """One check's outcome, without the raw text it matched."""

    check: str
    action: Literal["allow", "redact", "block", "flag"]
    mode: Literal["enforce", "warn", "dryrun"]
    score: float
    evidence: list[str] = Field(
        description="Why: pattern names, entity types and counts, classifier scores; "
        "matched text is never included."
    )
    spans: list[Span] = Field(
        description="Where the evidence lies: PII entities that were replaced and "
        "injection pattern matches found in the text as sent; empty where a check gives "
        "no location (classifier, topics, secrets, leaks)."
    )
    latency_ms: float = Field(description="Time this check took, in milliseconds.")


class CheckedMessage(BaseModel):
    role: str
    content: str


class GuardrailsCheckResponse(BaseModel):
    """What the chat path would decide for this text under the caller's policy."""

    object: Literal["guardrails.check"] = "guardrails.check"
    policy: str = Field(description="Name of the caller's policy.")
    policy_version: str
    direction: Direction
    decision: Decision = Field(
        description="`block`: a check in enforce mode refuses it; `redact`: it goes on "
        "changed; `allow`: it goes on as sent."
    )
    verdicts: list[CheckVerdict]
    text: str | None = Field(
        default=None,
        description="The text as the model (input) or the client (output) would receive "
        "it; for a blocked input, the text as sent is not echoed (null).",
    )
    messages: list[CheckedMessage] | None = Field(
        default=None, description="For `messages`: each as the model would receive it."
    )

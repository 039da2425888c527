"""OpenAI's legacy text-completions request, validated at the edge."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, field_validator

from gateway.http.sampling_request import SamplingRequest

# The policy's `model.max_choices` bounds the generations of one request (prompts times
# `n`); this bounds what is read before the policy is known.
MAX_CHOICES = 128
MAX_LOGPROBS = 5
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this endpoint


class CompletionRequest(SamplingRequest):
    """Every parameter OpenAI defines for `/v1/completions`; the service refuses the ones
    Bastion cannot honour (`suffix`, `best_of` above 1), and any other is unknown."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: str | list[str] = Field(
        description="A text, or a list of texts (one choice per text and `n`); token-id "
        "arrays are refused."
    )
    max_tokens: int | None = Field(default=None, gt=0)
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1)

    @field_validator("prompt", mode="before")
    @classmethod
    def _text_prompts(cls, value: Any) -> Any:
        """Token-id prompts would need the model's tokenizer at the edge; they are named
        as such instead of failing as a wrong type."""
        items = value if isinstance(value, list) else [value]
        if any(isinstance(item, int | list) for item in items):
            raise ValueError("token-id prompts are not supported; send the prompt as text")
        if isinstance(value, list) and not 1 <= len(value) <= MAX_CHOICES:
            raise ValueError(f"send between 1 and {MAX_CHOICES} prompts")
        if not all(isinstance(item, str) and item for item in items):
            raise ValueError("each prompt must be a non-empty string")
        return value

    @property
    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

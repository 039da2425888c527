"""OpenAI's legacy text-completions request, validated at the edge."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

# The policy's `model.max_choices` bounds the generations of one request (prompts times
# `n`); this bounds what is read before the policy is known.
MAX_CHOICES = 128
MAX_STOP_SEQUENCES = 4
MAX_LOGIT_BIAS = 300
MAX_LOGPROBS = 5
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this endpoint


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class CompletionRequest(BaseModel):
    """Every parameter OpenAI defines for `/v1/completions`; the service refuses the ones
    Bastion cannot honour (`suffix`, `best_of` above 1), and any other is unknown."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    prompt: str | list[str] = Field(
        description="A text, or a list of texts (one choice per text and `n`); token-id "
        "arrays are refused."
    )
    max_tokens: int | None = Field(default=None, gt=0)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(
        default=None, description="Token ids (as strings) to a bias in [-100, 100]."
    )
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1)
    user: str | None = Field(default=None, max_length=256)

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

    @field_validator("stop")
    @classmethod
    def _stop_limit(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences are allowed")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _token_biases(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is None:
            return None
        if len(value) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} tokens may be biased")
        for token, bias in value.items():
            if not token.isascii() or not token.isdigit() or len(token) > 9:
                raise ValueError(f"{token!r} is not a token id")
            if not -100 <= bias <= 100:
                raise ValueError(f"the bias of token {token} must be between -100 and 100")
        return value

    @property
    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def token_biases(self) -> tuple[tuple[int, float], ...]:
        return tuple((int(token), bias) for token, bias in (self.logit_bias or {}).items())

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

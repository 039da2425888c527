"""The OpenAI chat-completions request, validated at the edge."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engine import Engine
from gateway.http.sampling_request import SamplingRequest


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    name: str
    arguments: str

    @field_validator("arguments")
    @classmethod
    def _json_object(cls, value: str) -> str:
        """Written back into the prompt as JSON, so it must be a JSON object."""
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"arguments are not valid JSON: {exc.msg}") from exc
        if not isinstance(parsed, dict):
            raise ValueError("arguments must be a JSON object")
        return json.dumps(parsed, ensure_ascii=False)


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _content_present(self) -> Message:
        if self.role == "assistant" and self.tool_calls:
            return self
        if not self.text.strip():
            raise ValueError(f"a {self.role} message must have non-empty content")
        return self

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    # Calls are always constrained to the schema, so `strict` holds whatever its value.
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _valid_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        """Refused here, not after the model has answered with a call it cannot check."""
        try:
            Draft202012Validator.check_schema(value)
        except SchemaError as exc:
            raise ValueError(f"not a valid JSON Schema: {exc.message}") from exc
        return value


class ToolSpecIn(BaseModel):
    type: Literal["function"]
    function: FunctionSpec


class ResponseFormatText(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]


class ResponseFormatJsonObject(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["json_object"]


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str = ""
    # `schema` shadows a BaseModel attribute, hence the alias.
    json_schema: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormatJsonSchema(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


ResponseFormat = Annotated[
    ResponseFormatText | ResponseFormatJsonObject | ResponseFormatJsonSchema,
    Field(discriminator="type"),
]


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice

# OpenAI's chat-completion parameters that change nothing Bastion does: no answer is stored
# for OpenAI's products, metadata and identifiers only tag a request there, and prefix
# caching needs no key. Any other parameter not below is refused, naming it.
IGNORED_OPENAI_PARAMETERS = frozenset(
    {"metadata", "prompt_cache_key", "safety_identifier", "store"}
)


class ChatCompletionRequest(SamplingRequest):
    """OpenAI's chat-completion parameters that Bastion honours (docs/api.md lists each)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _drop_ignored(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return {k: v for k, v in data.items() if k not in IGNORED_OPENAI_PARAMETERS}

    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, gt=0)
    max_completion_tokens: int | None = Field(default=None, gt=0)
    n: int = Field(default=1, ge=1, le=128)
    tools: list[ToolSpecIn] | None = Field(default=None, max_length=128)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    modalities: list[Literal["text"]] | None = None


class ModelCard(BaseModel):
    """One model; `max_model_len` (vLLM's name) is its context window in tokens, what a
    gateway in front of this one reads (engine/upstream/server_info.py)."""

    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "bastion"
    max_model_len: int


class ModelList(BaseModel):
    """`GET /v1/models`, in OpenAI's shape."""

    object: Literal["list"] = "list"
    data: list[ModelCard]

    @classmethod
    def of(cls, engines: Sequence[Engine]) -> ModelList:
        return cls(data=[ModelCard(id=e.model_id, max_model_len=e.context_window) for e in engines])

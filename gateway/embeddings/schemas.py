"""The OpenAI embeddings request and response, validated at the edge."""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
)
from pydantic_core import PydanticCustomError

# OpenAI's limit on the inputs of one request.
MAX_INPUTS = 2048

Text = Annotated[StrictStr, Field(min_length=1)]
TokenIds = Annotated[list[Annotated[StrictInt, Field(ge=0)]], Field(min_length=1)]
Input = (
    Text
    | Annotated[list[Text], Field(min_length=1, max_length=MAX_INPUTS)]
    | TokenIds
    | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_INPUTS)]
)
_INPUT_SHAPES = (
    f"a non-empty string, a list of 1 to {MAX_INPUTS} non-empty strings, a non-empty list "
    f"of token ids, or a list of 1 to {MAX_INPUTS} non-empty lists of token ids"
)


class EmbeddingRequest(BaseModel):
    """OpenAI's embeddings parameters; all of them are honoured, any other is refused.

    Token ids (`input` as a list of ints or of int lists) are ids of the embedding model's
    own vocabulary (MiniLM's WordPiece, not tiktoken's): they are decoded with its
    tokenizer and the text is embedded.
    """

    model_config = ConfigDict(extra="forbid")

    input: Input = Field(
        description="The texts to embed: " + _INPUT_SHAPES + ". Token ids are the embedding "
        "model's own (MiniLM's WordPiece vocabulary, not tiktoken's). Each input must fit "
        "the model's 256 positions: at most 254 tokens besides [CLS] and [SEP].",
        # Litestar's document drops the constraints inside a union; pydantic's keeps them.
        json_schema_extra={"oneOf": TypeAdapter(Input).json_schema()["anyOf"]},
    )
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(
        default=None, ge=1, description="The vectors' size: only the model's own, 384."
    )
    user: str | None = Field(default=None, max_length=256)

    @field_validator("input", mode="wrap")
    @classmethod
    def _one_of_the_shapes(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        """One error naming `input` and its accepted shapes, instead of one per shape."""
        if isinstance(value, list) and len(value) > MAX_INPUTS:
            raise PydanticCustomError(
                "too_many_inputs",
                "at most {limit} inputs per request, got {count}",
                {"limit": MAX_INPUTS, "count": len(value)},
            )
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError(
                "input_shape", "expected {shapes}", {"shapes": _INPUT_SHAPES}
            ) from None

    @property
    def inputs(self) -> list[str] | list[list[int]]:
        """The inputs as a list: texts, or token-id lists."""
        value = self.input
        if isinstance(value, str):
            return [value]
        if isinstance(value[0], int):
            return [value]
        return value


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # base64: the float32 values, little-endian


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    """`POST /v1/embeddings`, in OpenAI's shape."""

    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage

    @classmethod
    def of(
        cls,
        vectors: npt.NDArray[np.float32],
        model: str,
        tokens: int,
        encoding_format: Literal["float", "base64"],
    ) -> EmbeddingList:
        return cls(
            data=[
                Embedding(index=i, embedding=_encoded(row, encoding_format))
                for i, row in enumerate(vectors)
            ],
            model=model,
            usage=EmbeddingUsage(prompt_tokens=tokens, total_tokens=tokens),
        )


def _encoded(
    row: npt.NDArray[np.float32], encoding_format: Literal["float", "base64"]
) -> list[float] | str:
    if encoding_format == "base64":
        # What OpenAI's clients decode: the raw little-endian float32 bytes.
        return base64.b64encode(row.astype("<f4").tobytes()).decode("ascii")
    return [float(x) for x in row.tolist()]

"""The embeddings request path: model and size checks, token limits, the input
guardrails, then the embedder. HTTP concerns stay in `routes`.

Inputs are embedded as the input guardrails let them through: PII the policy redacts is
replaced by its placeholder before embedding, so no vector encodes it (and a redacted
text's vector is close to other texts with the same kind of PII, not to the original).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gateway.audit.log import AuditEntry
from gateway.embeddings.schemas import EmbeddingRequest
from gateway.http.errors import ApiError, guardrail_block
from gateway.http.model_requests import check_model
from gateway.keys.store import KeyIdentity
from gateway.limits.quotas import charge_tokens
from gateway.policy.runtime import PolicyRuntime
from gateway.services import Services
from gateway.tracing import embedding_stage, note_policy, trace_check
from retrieval import Embedder

EMBEDDING_EVENT = "embedding"
# [CLS] and [SEP] take two of the positions the model reads.
_SPECIAL_TOKENS = 2


@dataclass(frozen=True, slots=True)
class Embedded:
    """The vectors of a request's inputs, in order, and the tokens they were read as."""

    vectors: npt.NDArray[np.float32]
    prompt_tokens: int


class EmbeddingService:
    """Runs one embeddings request through the caller's policy and the embedder."""

    def __init__(self, services: Services, runtime: PolicyRuntime) -> None:
        self._services = services
        self._runtime = runtime
        self._embedder: Embedder = services.embedder

    async def embed(self, body: EmbeddingRequest, entry: AuditEntry) -> Embedded:
        """The vectors of `body`'s inputs; every check that refuses it raises `ApiError`."""
        self._record_request(body, entry)
        check_model(body.model, self._embedder.model_id)
        self._check_dimensions(body.dimensions)
        texts = await asyncio.to_thread(self._texts, body.inputs)
        self._check_lengths(await asyncio.to_thread(self._embedder.token_ids, texts), "")
        screened = await self._screen_input(texts, entry)
        # Redaction can lengthen a text (a placeholder is several tokens).
        tokens = await asyncio.to_thread(self._embedder.token_ids, screened)
        self._check_lengths(tokens, " after PII redaction")
        prompt_tokens = sum(len(ids) for ids in tokens)
        with embedding_stage(len(screened), prompt_tokens):
            vectors = await asyncio.to_thread(self._embedder.embed, screened)
        entry.prompt_tokens = prompt_tokens
        entry.outcome = "ok"
        return Embedded(vectors, entry.prompt_tokens)

    async def charge(self, identity: KeyIdentity, embedded: Embedded) -> None:
        """Charge the inputs' tokens to the caller's token budgets."""
        limits = self._runtime.loaded.policy.rate_limits
        await asyncio.to_thread(
            charge_tokens, self._services.limiter, identity, limits, embedded.prompt_tokens
        )

    def _record_request(self, body: EmbeddingRequest, entry: AuditEntry) -> None:
        note_policy(self._runtime.loaded)
        entry.policy_version = self._runtime.loaded.version
        entry.model = self._embedder.model_id
        entry.end_user = body.user
        entry.details = {"inputs": len(body.inputs), "encoding_format": body.encoding_format}

    def _check_dimensions(self, dimensions: int | None) -> None:
        """The model's vectors have one size; a request may name it, never another."""
        native = self._embedder.dimension
        if dimensions not in (None, native):
            raise ApiError(
                400,
                f"dimensions must be {native} for {self._embedder.model_id}, "
                f"which does not shorten its vectors; got {dimensions}.",
                param="dimensions",
                code="invalid_value",
            )

    def _texts(self, inputs: Sequence[str | list[int]]) -> list[str]:
        """The texts to embed: token-id inputs decoded with the model's tokenizer."""
        vocabulary = self._embedder.vocabulary_size
        texts: list[str] = []
        for index, item in enumerate(inputs):
            if isinstance(item, str):
                texts.append(item)
                continue
            unknown = next((i for i in item if i >= vocabulary), None)
            if unknown is not None:
                raise _input_error(
                    f"input {index} holds token id {unknown}, outside "
                    f"{self._embedder.model_id}'s vocabulary of {vocabulary} tokens."
                )
            texts.append(self._embedder.decode(item))
        return texts

    def _check_lengths(self, tokens: Sequence[Sequence[int]], when: str) -> None:
        """Refuse an input with no tokens, or with more than the model reads (OpenAI
        refuses over-long inputs rather than cutting them, and so does Bastion)."""
        limit = self._embedder.max_tokens - _SPECIAL_TOKENS
        for index, ids in enumerate(tokens):
            if not ids:
                raise _input_error(f"input {index} has no tokens{when}.")
            if len(ids) > limit:
                raise _input_error(
                    f"input {index} is {len(ids)} tokens long{when}; "
                    f"{self._embedder.model_id} reads at most {limit} tokens per input.",
                )

    async def _screen_input(self, texts: list[str], entry: AuditEntry) -> list[str]:
        """Run the input guardrails over every input; a blocking verdict refuses the request.

        The topic check reads the head of the inputs joined, as it reads the head of a long
        message.
        """
        checked = await asyncio.to_thread(
            self._runtime.input_guardrails.check,
            texts,
            "\n".join(texts),
            ["input"] * len(texts),
            trace=trace_check,
        )
        entry.verdicts.extend(checked.verdicts)
        if checked.blocking is not None:
            entry.outcome = "blocked"
            reason = "; ".join(checked.blocking.evidence) or checked.blocking.check
            raise guardrail_block(checked.blocking.check, reason, param="input")
        entry.store_content = self._runtime.loaded.policy.audit.store_content
        entry.prompt_text = json.dumps(checked.texts, ensure_ascii=False)
        return list(checked.texts)


def _input_error(message: str) -> ApiError:
    return ApiError(400, message, param="input", code="invalid_value")

"""A `GenerationRequest` as an OpenAI-compatible request body, or a typed refusal.

Forwarded: `max_tokens`, `temperature`, `top_p`, `seed`, `stop`, `presence_penalty`,
`frequency_penalty`, `logprobs`/`top_logprobs`, and as extras that vLLM, SGLang and
llama.cpp read (others ignore them) `top_k` and `ignore_eos`; a `json_schema` or
`json_object` constraint as `response_format`; the tenant's `cache_salt` when the config
says the upstream takes it (vLLM). Not forwarded, and refused rather than dropped:
`logit_bias` and `stop_token_ids` (they name token ids of the local vocabulary, which the
upstream's need not share), and regex, grammar and structural-tag constraints (each
server spells them differently: vLLM's `structured_outputs`, llama.cpp's GBNF `grammar`).
`speculative` is the embedded engine's optimisation and changes no output: it is ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from engine.types import (
    Constraint,
    ConstraintError,
    GenerationRequest,
    SamplingParams,
    UnsupportedParameter,
)
from engine.upstream.config import UpstreamConfig

CHAT_PATH = "/chat/completions"
COMPLETIONS_PATH = "/completions"


@dataclass(frozen=True, slots=True)
class UpstreamRequest:
    """Where to send a request (a path under a base URL) and its JSON body."""

    path: str
    body: dict[str, Any]

    @property
    def is_chat(self) -> bool:
        return self.path == CHAT_PATH


def upstream_request(config: UpstreamConfig, request: GenerationRequest) -> UpstreamRequest:
    """The streamed chat (or, with `prompt`, completions) request for `request`; raises
    `UnsupportedParameter` or `ConstraintError` before anything is sent."""
    params = request.sampling
    _refuse_local_ids(params)
    body: dict[str, Any] = {
        "model": config.upstream_model,
        "stream": True,
        "stream_options": {"include_usage": True},
        **_sampling_fields(params),
    }
    if config.forward_cache_salt and request.cache_salt:
        body["cache_salt"] = request.cache_salt
    if request.prompt is not None:
        body["prompt"] = request.prompt
        if params.logprobs:
            body["logprobs"] = params.top_logprobs  # the legacy API: how many alternatives
        if params.constraint is not None:
            body["response_format"] = response_format(params.constraint)
        return UpstreamRequest(COMPLETIONS_PATH, body)
    body["messages"] = [{"role": m.role, "content": m.content} for m in request.messages]
    if params.logprobs:
        body["logprobs"] = True
        body["top_logprobs"] = params.top_logprobs
    if params.constraint is not None:
        body["response_format"] = response_format(params.constraint)
    return UpstreamRequest(CHAT_PATH, body)


def response_format(constraint: Constraint) -> dict[str, Any]:
    """OpenAI's `response_format` for a JSON constraint; `ConstraintError` for the rest."""
    if constraint.kind == "json_object":
        return {"type": "json_object"}
    if constraint.kind == "json_schema":
        try:
            schema = json.loads(constraint.source)
        except json.JSONDecodeError as exc:
            raise ConstraintError(f"the JSON Schema is not valid JSON: {exc}") from exc
        return {
            "type": "json_schema",
            "json_schema": {"name": "response", "schema": schema, "strict": True},
        }
    raise ConstraintError(
        f"a {constraint.kind} constraint cannot be forwarded to an upstream server "
        "(OpenAI's API has no portable form of it); use a JSON Schema"
    )


def _sampling_fields(params: SamplingParams) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
    }
    if params.seed is not None:
        fields["seed"] = params.seed
    if params.stop:
        fields["stop"] = list(params.stop)
    if params.presence_penalty:
        fields["presence_penalty"] = params.presence_penalty
    if params.frequency_penalty:
        fields["frequency_penalty"] = params.frequency_penalty
    if params.top_k:
        fields["top_k"] = params.top_k
    if params.ignore_eos:
        fields["ignore_eos"] = True
    return fields


def _refuse_local_ids(params: SamplingParams) -> None:
    if params.logit_bias:
        raise UnsupportedParameter(
            "logit_bias",
            "logit_bias is not supported for this model: its token ids name the local "
            "vocabulary, and the upstream server's may differ",
        )
    if params.stop_token_ids:
        raise UnsupportedParameter(
            "stop",
            "stop token ids are not supported for this model (they name local token ids); "
            "use stop strings",
        )

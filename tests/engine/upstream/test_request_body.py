"""What a `GenerationRequest` becomes on the wire, and what is refused."""

from __future__ import annotations

import pytest

from engine import (
    Constraint,
    ConstraintError,
    GenerationRequest,
    SamplingParams,
    UnsupportedParameter,
)
from engine.upstream.request_body import CHAT_PATH, COMPLETIONS_PATH, upstream_request
from tests.engine.upstream.conftest import QUESTION, upstream_config

CONFIG = upstream_config("http://upstream/v1")


def test_a_raw_prompt_is_a_completions_request_with_legacy_logprobs() -> None:
    sampling = SamplingParams(max_tokens=3, logprobs=True, top_logprobs=2)
    sent = upstream_request(CONFIG, GenerationRequest("r", (), sampling, prompt="Once"))
    assert sent.path == COMPLETIONS_PATH
    assert sent.body["prompt"] == "Once" and "messages" not in sent.body
    assert sent.body["logprobs"] == 2 and "top_logprobs" not in sent.body


def test_a_chat_asks_for_logprobs_as_the_chat_api_does() -> None:
    sampling = SamplingParams(logprobs=True, top_logprobs=3)
    sent = upstream_request(CONFIG, GenerationRequest("r", QUESTION, sampling))
    assert sent.path == CHAT_PATH
    assert (sent.body["logprobs"], sent.body["top_logprobs"]) == (True, 3)


def test_json_constraints_become_response_format() -> None:
    def format_of(constraint: Constraint) -> object:
        sampling = SamplingParams(constraint=constraint)
        return upstream_request(CONFIG, GenerationRequest("r", QUESTION, sampling)).body[
            "response_format"
        ]

    assert format_of(Constraint("json_object")) == {"type": "json_object"}
    assert format_of(Constraint("json_schema", '{"type": "integer"}')) == {
        "type": "json_schema",
        "json_schema": {"name": "response", "schema": {"type": "integer"}, "strict": True},
    }


@pytest.mark.parametrize("kind", ["regex", "grammar", "structural_tag"])
def test_other_constraints_are_refused(kind: str) -> None:
    sampling = SamplingParams(constraint=Constraint(kind, "x"))  # type: ignore[arg-type]
    with pytest.raises(ConstraintError, match=kind):
        upstream_request(CONFIG, GenerationRequest("r", QUESTION, sampling))


def test_local_token_ids_are_refused() -> None:
    with pytest.raises(UnsupportedParameter) as caught:
        sampling = SamplingParams(stop_token_ids=(2,))
        upstream_request(CONFIG, GenerationRequest("r", QUESTION, sampling))
    assert caught.value.param == "stop"

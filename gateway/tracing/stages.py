"""The stage spans of one request, under its server span.

The server span's middleware (`gateway.tracing.middleware`) puts the request's
`RequestTrace` in a context variable; the request path wraps each stage in `stage` or
`in_span`. Without a `RequestTrace` (tracing off, or a path outside a traced request)
they cost one context-variable read: `stage` yields the API's non-recording span and
`in_span` returns the function unchanged.

Attributes hold names, counts, actions and scores, never a prompt, an answer, a
verdict's evidence or a key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from opentelemetry.trace import INVALID_SPAN, Span, Tracer
from opentelemetry.util.types import AttributeValue

from gateway.audit.log import AuditEntry
from gateway.chat.sources import Sources
from gateway.http.errors import ApiError
from gateway.keys.store import KeyIdentity
from gateway.policy.schema import LoadedPolicy
from guardrails import Verdict
from guardrails.output_check import OutputCheckResult
from guardrails.pii import PiiCheck

P = ParamSpec("P")
T = TypeVar("T")

# Attribute names: OpenTelemetry's GenAI conventions where one fits, else `bastion.*`.
TENANT = "bastion.tenant"
REQUEST_ID = "bastion.request_id"
POLICY_NAME = "bastion.policy.name"
POLICY_VERSION = "bastion.policy.version"
MODEL = "gen_ai.request.model"
OPERATION = "gen_ai.operation.name"
UPSTREAM = "bastion.upstream"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHED_TOKENS = "bastion.usage.cached_prompt_tokens"
FINISH_REASONS = "gen_ai.response.finish_reasons"
OUTCOME = "bastion.outcome"
ERROR_CODE = "bastion.error_code"
VERDICTS = "bastion.verdicts"  # "check:action" for every verdict, in order
CHECK = "bastion.check"
VERDICT_ACTION = "bastion.verdict.action"
VERDICT_SCORE = "bastion.verdict.score"
VERDICT_MODE = "bastion.verdict.mode"
EMBEDDING_INPUTS = "bastion.embedding.inputs"
RETRIEVAL_CHUNKS = "bastion.retrieval.chunks"
RETRIEVAL_DROPPED = "bastion.retrieval.dropped"
RETRIEVAL_CANCELLED = "bastion.retrieval.cancelled"  # a block stopped it


@dataclass(frozen=True, slots=True)
class RequestTrace:
    """The tracer and the server span of the request being served."""

    tracer: Tracer
    span: Span


_CURRENT: ContextVar[RequestTrace | None] = ContextVar("bastion_request_trace", default=None)


def current_request() -> RequestTrace | None:
    return _CURRENT.get()


@contextmanager
def serving(request: RequestTrace) -> Iterator[None]:
    """Make `request` the traced request for the code run inside (the middleware's)."""
    token = _CURRENT.set(request)
    try:
        yield
    finally:
        _CURRENT.reset(token)


@contextmanager
def stage(name: str, attributes: Mapping[str, AttributeValue] | None = None) -> Iterator[Span]:
    """A child span of the current one for the block, current inside it."""
    request = _CURRENT.get()
    if request is None:
        yield INVALID_SPAN
        return
    with request.tracer.start_as_current_span(name, attributes=attributes) as span:
        yield span


def in_span(
    name: str, run: Callable[P, T], describe: Callable[[Span, T], None] | None = None
) -> Callable[P, T]:
    """`run` in a stage span (for `asyncio.to_thread`, which keeps the caller's context);
    `describe` adds attributes from its result."""
    if _CURRENT.get() is None:
        return run

    def traced(*args: P.args, **kwargs: P.kwargs) -> T:
        with stage(name) as span:
            result = run(*args, **kwargs)
            if describe is not None:
                describe(span, result)
            return result

    return traced


def annotate(attributes: Mapping[str, AttributeValue]) -> None:
    """Set attributes on the request's server span."""
    request = _CURRENT.get()
    if request is not None:
        request.span.set_attributes(attributes)


# -- what each stage records -------------------------------------------------------------


def trace_check(check: str, run: Callable[[], T]) -> T:
    """One input check in its own span (`input_check.<check>`) with its verdict; the
    `CheckTrace` the input guardrails take."""
    return in_span(f"input_check.{check}", run, describe_verdicts)()


def describe_verdicts(span: Span, result: object) -> None:
    """A check's action, score and mode (`Verdict`, `PiiCheck`); a pipeline's
    `check:action` list (`OutputCheckResult`)."""
    if isinstance(result, OutputCheckResult):
        span.set_attribute(VERDICTS, verdict_list(result.verdicts))
        return
    verdict = result.verdict if isinstance(result, PiiCheck) else result
    if not isinstance(verdict, Verdict):
        return
    span.set_attributes(
        {
            CHECK: verdict.check,
            VERDICT_ACTION: verdict.action,
            VERDICT_SCORE: float(verdict.score),
            VERDICT_MODE: verdict.mode,
        }
    )


def describe_retrieval(span: Span, sources: Sources) -> None:
    span.set_attributes(
        {
            RETRIEVAL_CHUNKS: len(sources.chunks),
            RETRIEVAL_DROPPED: len(sources.dropped),
            RETRIEVAL_CANCELLED: sources.cancelled,
        }
    )


def embedding_stage(inputs: int, tokens: int) -> AbstractContextManager[Span]:
    """The embedder's pass over a request's screened inputs: how many and their tokens."""
    return stage(
        "embedding", {OPERATION: "embeddings", EMBEDDING_INPUTS: inputs, INPUT_TOKENS: tokens}
    )


def describe_auth(span: Span, identity: KeyIdentity | None, error: ApiError | None) -> None:
    """The caller's tenant and role (never the key), on the auth span and the request's."""
    if identity is not None:
        span.set_attributes({TENANT: identity.tenant, "bastion.auth.role": identity.role})
        annotate({TENANT: identity.tenant})
    span.set_attribute("bastion.auth.status", error.status if error is not None else 200)


def note_policy(loaded: LoadedPolicy) -> None:
    annotate({POLICY_NAME: loaded.policy.name, POLICY_VERSION: loaded.version})


def describe_entry(entry: AuditEntry) -> None:
    """What the request's audit record says, on the server span, as it is written."""
    attributes: dict[str, AttributeValue] = {
        REQUEST_ID: entry.request_id,
        OUTCOME: entry.outcome,
        INPUT_TOKENS: entry.prompt_tokens,
        OUTPUT_TOKENS: entry.completion_tokens,
        VERDICTS: verdict_list(entry.verdicts),
    }
    optional = {
        TENANT: entry.tenant,
        POLICY_VERSION: entry.policy_version,
        MODEL: entry.model,
        ERROR_CODE: entry.error_code,
        UPSTREAM: entry.upstream,  # also where no engine span says it: refused at once
    }
    attributes |= {name: value for name, value in optional.items() if value is not None}
    cached = entry.details.get("cached_prompt_tokens")
    if isinstance(cached, int):
        attributes[CACHED_TOKENS] = cached
    annotate(attributes)


def verdict_list(verdicts: Sequence[Verdict]) -> list[str]:
    return [f"{v.check}:{v.action}" for v in verdicts]

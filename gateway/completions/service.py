"""The text-completion request path: input guardrails over each prompt, the engine (one
generation per choice, all at once), output guardrails over each answer.

The chat path without retrieval or a chat template: the prompt is continued as written.
HTTP concerns stay in `routes`.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from engine import (
    ContextLengthExceeded,
    Engine,
    FinishReason,
    GenerationRequest,
    SamplingParams,
    TokenDelta,
)
from gateway.audit.log import AuditEntry
from gateway.completions.logprobs import LogprobGate
from gateway.completions.merge import merged
from gateway.completions.schemas import DEFAULT_MAX_TOKENS, CompletionRequest
from gateway.http.errors import ApiError, guardrail_block
from gateway.http.model_requests import (
    EngineRefusal,
    answer_budget,
    check_token_bias,
    context_error,
    engine_refusal,
    model_engine,
    refusing_upstream,
)
from gateway.http.off_loop import run_stage
from gateway.keys.store import KeyIdentity
from gateway.limits.quotas import charge
from gateway.policy.runtime import PolicyRuntime
from gateway.services import Services
from gateway.tracing import in_span, note_policy, trace_check, traced_deltas

PROMPT_PARAM = "prompt"
T = TypeVar("T")


@dataclass
class Choice:
    """One generation: the `n`-th answer to one prompt, as the engine writes it."""

    index: int
    prompt: str  # as the client sent it, for `echo`
    generation: GenerationRequest
    restorable: dict[str, str]
    answer: LogprobGate = field(default_factory=LogprobGate)  # raw text and its logprobs
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens the engine's prefix cache served
    completion_tokens: int = 0
    finish: FinishReason | None = None

    def record(self, delta: TokenDelta) -> None:
        self.answer.add(delta.text, delta.logprobs)
        self.prompt_tokens, self.completion_tokens = delta.prompt_tokens, delta.completion_tokens
        self.cached_prompt_tokens = delta.cached_prompt_tokens
        self.finish = delta.finish_reason or self.finish


@dataclass(frozen=True, slots=True)
class Piece:
    """Released text of one choice, with the logprobs of the tokens that spell it."""

    index: int
    text: str
    logprobs: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class ChoiceResult:
    """What the output checks let through for one choice (without the echoed prompt)."""

    index: int
    text: str
    finish_reason: str
    logprobs: dict[str, Any] | None


@dataclass
class PreparedCompletion:
    """A request that passed the input stages, with a generation for each choice."""

    completion_id: str
    created: int
    model: str
    engine: Engine  # the engine serving `model`: embedded, or an upstream's
    entry: AuditEntry
    choices: list[Choice]
    n: int
    logprobs: int | None
    echo: bool
    stream_window: int

    @property
    def prompt_tokens(self) -> int:
        """Each prompt once: its choices share its KV blocks through the prefix cache."""
        return sum(c.prompt_tokens for c in self.choices if c.index % self.n == 0)

    @property
    def cached_prompt_tokens(self) -> int:
        """Of `prompt_tokens`, those the prefix cache served (each prompt's first choice)."""
        return sum(c.cached_prompt_tokens for c in self.choices if c.index % self.n == 0)

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.choices)


class CompletionService:
    """Runs one text-completion request through every stage of the request path."""

    def __init__(self, services: Services, runtime: PolicyRuntime) -> None:
        self._services = services
        self._runtime = runtime

    async def prepare(self, body: CompletionRequest, entry: AuditEntry) -> PreparedCompletion:
        """Check `body` against the policy, screen its prompts and build one engine
        request per choice; every check that refuses it raises `ApiError`."""
        policy = self._runtime.loaded.policy
        engine = model_engine(self._services.models, body.model, policy.model)
        entry.policy_version = self._runtime.loaded.version
        note_policy(self._runtime.loaded)
        entry.model = engine.model_id
        entry.end_user = body.user
        _refuse_unsupported(body)
        _check_choices(body, policy.model.max_choices)
        check_token_bias(engine, bool(body.token_bias))
        _check_token_ids(body, engine.vocab_size)
        requested = body.max_tokens or min(DEFAULT_MAX_TOKENS, policy.model.max_tokens)
        max_tokens = answer_budget(policy.model, requested, body.temperature)
        _check_context(engine, body.prompts, max_tokens)
        screened = await self._screen(body.prompts, entry)
        entry.store_content = policy.audit.store_content
        entry.prompt_text = _one_text([text for text, _ in screened])
        return PreparedCompletion(
            completion_id=f"cmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=engine.model_id,
            engine=engine,
            entry=entry,
            choices=self._choices(
                body, entry, screened, max_tokens, policy.model.speculative_decoding
            ),
            n=body.n,
            logprobs=body.logprobs,
            echo=body.echo,
            stream_window=policy.output.stream_window_chars,
        )

    async def _screen(
        self, prompts: list[str], entry: AuditEntry
    ) -> list[tuple[str, dict[str, str]]]:
        """Each prompt as the input guardrails let it through, with the placeholders its
        answer may restore; a blocking verdict refuses the request."""
        checks = self._runtime.input_guardrails

        def screen_all() -> list[tuple[str, dict[str, str]]]:
            screened = []
            for prompt in prompts:
                checked = checks.check([prompt], prompt, ["user"], trace=trace_check)
                entry.verdicts.extend(checked.verdicts)
                if checked.blocking is not None:
                    entry.outcome = "blocked"
                    reason = "; ".join(checked.blocking.evidence) or checked.blocking.check
                    raise guardrail_block(checked.blocking.check, reason, PROMPT_PARAM)
                screened.append((checked.texts[0], dict(checked.restorable)))
            return screened

        return await run_stage(self._runtime.loaded.policy.input.any_enabled(), screen_all)

    @staticmethod
    def _choices(
        body: CompletionRequest,
        entry: AuditEntry,
        screened: list[tuple[str, dict[str, str]]],
        max_tokens: int,
        speculative: bool,
    ) -> list[Choice]:
        """`n` generations per prompt, indexed as OpenAI indexes them (prompt by prompt).
        A seed is offset per choice, so that seeded choices differ yet repeat."""
        choices = []
        for prompt_index, (text, restorable) in enumerate(screened):
            for k in range(body.n):
                index = prompt_index * body.n + k
                sampling = SamplingParams(
                    max_tokens=max_tokens,
                    temperature=body.temperature,
                    top_p=body.top_p,
                    seed=None if body.seed is None else body.seed + index,
                    stop=body.stop_sequences,
                    presence_penalty=body.presence_penalty,
                    frequency_penalty=body.frequency_penalty,
                    logprobs=body.logprobs is not None,
                    top_logprobs=body.logprobs or 0,
                    logit_bias=body.token_bias,
                    speculative=speculative,
                )
                generation = GenerationRequest(
                    request_id=entry.request_id,
                    messages=(),
                    sampling=sampling,
                    cache_salt=entry.tenant or "",
                    prompt=text,
                )
                choices.append(Choice(index, body.prompts[prompt_index], generation, restorable))
        return choices

    async def complete(self, prepared: PreparedCompletion) -> list[ChoiceResult]:
        """Run every choice to its end, then apply the output checks to each whole answer
        (nothing is released early, so no window is needed)."""
        async for _ in self._generations(
            prepared, [self._deltas(prepared, c) for c in prepared.choices]
        ):
            pass
        return await self.finish(prepared, None)

    def stream(self, prepared: PreparedCompletion) -> AsyncGenerator[Piece, None]:
        """Every choice's text as the engine writes it, PII-filtered with a held-back window."""
        return self._generations(prepared, [self._pieces(prepared, c) for c in prepared.choices])

    async def _pieces(self, prepared: PreparedCompletion, choice: Choice) -> AsyncIterator[Piece]:
        if not self._runtime.output.changes_text(choice.restorable):
            # Nothing to check or restore: each delta goes out as it comes, without waiting
            # for a word's end or a hop to a thread (a token's time at the first token).
            async for delta in self._deltas(prepared, choice):
                if delta.text:
                    yield self._piece(prepared, choice, delta.text, final=False)
            rest = ""
        else:
            redactor = self._runtime.output.streaming(choice.restorable, prepared.stream_window)
            release = in_span("output_check.stream_window", redactor.release)
            async for delta in self._deltas(prepared, choice):
                # Holding a delta is cheap; only a due check goes to a thread.
                if redactor.add(delta.text) and (released := await asyncio.to_thread(release)):
                    yield self._piece(prepared, choice, released, final=False)
            rest = await asyncio.to_thread(in_span("output_check.stream_window", redactor.flush))
        last = self._piece(prepared, choice, rest, final=True)
        if last.text or (last.logprobs and last.logprobs["tokens"]):
            yield last

    @staticmethod
    def _piece(prepared: PreparedCompletion, choice: Choice, text: str, *, final: bool) -> Piece:
        if prepared.logprobs is None:
            return Piece(choice.index, text, None)
        return Piece(choice.index, text, choice.answer.released_body(text, final=final))

    @staticmethod
    async def _generations(
        prepared: PreparedCompletion, sources: list[AsyncIterator[T]]
    ) -> AsyncGenerator[T, None]:
        """The choices' streams read as one, the engine's time recorded on the entry."""
        started = time.perf_counter()
        try:
            async for item in merged(sources):
                yield item
        finally:
            prepared.entry.engine_ms += (time.perf_counter() - started) * 1000

    async def _deltas(
        self, prepared: PreparedCompletion, choice: Choice
    ) -> AsyncIterator[TokenDelta]:
        """One choice's engine deltas, recorded as they come; the engine's refusals
        become API errors the client can act on."""
        entry = prepared.entry
        try:
            deltas = prepared.engine.stream(choice.generation)
            async for delta in traced_deltas(deltas, choice.index):
                choice.record(delta)
                if delta.served_by:
                    entry.upstream = delta.served_by
                entry.prompt_tokens = prepared.prompt_tokens
                entry.details["cached_prompt_tokens"] = prepared.cached_prompt_tokens
                entry.completion_tokens = prepared.completion_tokens
                yield delta
        except EngineRefusal as exc:
            entry.upstream = refusing_upstream(exc) or entry.upstream
            raise engine_refusal(exc, PROMPT_PARAM) from exc

    async def finish(
        self, prepared: PreparedCompletion, released: dict[int, str] | None
    ) -> list[ChoiceResult]:
        """What the client gets once generation ended. The output checks run over each
        whole answer, for the audit record and, when nothing was streamed (`released`
        None), for the text itself; a blocking verdict withholds the text."""
        check_answers = in_span("output_check", self._check_answers)
        checks = any(self._runtime.output.changes_text(c.restorable) for c in prepared.choices)
        results = await run_stage(checks, check_answers, prepared, released)
        entry = prepared.entry
        filtered = any(r.finish_reason == "content_filter" for r in results)
        entry.outcome = "content_filter" if filtered else "ok"
        entry.status_code = 200
        entry.answer_text = _one_text([r.text for r in results])
        return results

    def _check_answers(
        self, prepared: PreparedCompletion, released: dict[int, str] | None
    ) -> list[ChoiceResult]:
        results = []
        for choice in prepared.choices:
            checked = self._runtime.output.filter(choice.answer.raw, choice.restorable)
            prepared.entry.verdicts.extend(checked.verdicts)
            text = checked.text if released is None else released.get(choice.index, "")
            finish_reason = "length" if choice.finish == "length" else "stop"
            if any(v.blocks for v in checked.verdicts):
                text, finish_reason = "", "content_filter"
            logprobs = None
            if released is None and prepared.logprobs is not None:
                logprobs = choice.answer.released_body(text, final=True)
            results.append(ChoiceResult(choice.index, text, finish_reason, logprobs))
        return results

    async def charge(self, identity: KeyIdentity, prepared: PreparedCompletion) -> None:
        """Charge the answers' tokens to the caller's token budgets."""
        used = prepared.entry.prompt_tokens + prepared.entry.completion_tokens
        limits = self._runtime.loaded.policy.rate_limits
        await charge(self._services.limiter, identity, limits, used)


def _refuse_unsupported(body: CompletionRequest) -> None:
    """OpenAI parameters Bastion cannot honour are refused by name, never dropped."""
    if body.suffix is not None:
        raise _unsupported("suffix", "the served model cannot insert text before a suffix")
    if body.best_of is not None and body.best_of > 1:
        raise _unsupported("best_of", "ask for `n` choices and pick among them")
    if body.echo and body.logprobs is not None:
        raise _unsupported(
            "echo", "the engine scores no prompt tokens, so echo cannot come with logprobs"
        )


def _check_choices(body: CompletionRequest, max_choices: int) -> None:
    """Each choice is a generation of its own: the policy bounds how many one request runs."""
    count = len(body.prompts) * body.n
    if count > max_choices:
        raise ApiError(
            400,
            f"{len(body.prompts)} prompt(s) times n={body.n} is {count} choices, more than "
            f"this policy's limit of {max_choices}.",
            param="n" if body.n > max_choices else PROMPT_PARAM,
            code="invalid_value",
        )


def _check_context(engine: Engine, prompts: list[str], max_tokens: int) -> None:
    """Refuse a prompt that leaves no room for `max_tokens` in `engine`'s window, before
    any check runs on it; a redacted prompt that grows past it is refused by the engine."""
    for prompt in prompts:
        # Counted here, never by the upstream: these are the prompts before redaction.
        tokens = engine.count_text_tokens(prompt)
        if tokens + max_tokens > engine.context_window:
            exceeded = ContextLengthExceeded(tokens, max_tokens, engine.context_window)
            raise context_error(exceeded, PROMPT_PARAM)


def _check_token_ids(body: CompletionRequest, vocab_size: int) -> None:
    """A bias on a token the model does not have is refused here: in the engine it
    would fail the whole batch it runs in."""
    unknown = sorted(token for token, _ in body.token_bias if token >= vocab_size)
    if unknown:
        raise ApiError(
            400,
            f"logit_bias names token {unknown[0]}, but the model's token ids run from 0 "
            f"to {vocab_size - 1}.",
            param="logit_bias",
            code="invalid_value",
        )


def _unsupported(param: str, why: str) -> ApiError:
    return ApiError(
        400, f"'{param}' is not supported: {why}.", param=param, code="unsupported_parameter"
    )


def _one_text(texts: list[str]) -> str:
    """One text for the audit record: the text itself, or a JSON list of several."""
    return texts[0] if len(texts) == 1 else json.dumps(texts)

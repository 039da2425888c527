"""The chat request path: input guardrails, retrieval, engine, output guardrails.

Each stage is called through its own package's interface; this module only wires them
in order and keeps the audit entry up to date. HTTP concerns stay in `routes`.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from engine import (
    ChatMessage,
    ConstraintError,
    ContextLengthExceeded,
    Engine,
    GenerationRequest,
    SamplingParams,
    TextLogprob,
    TokenDelta,
)
from engine.tokenization import prompt_token_bound
from gateway.audit.log import AuditEntry
from gateway.chat.answer_check import check_json_answer
from gateway.chat.output_shape import OutputShape, output_shape, shape_for
from gateway.chat.prompt import engine_messages
from gateway.chat.request_checks import allowed_tools, check_client_schemas, check_parameters
from gateway.chat.schemas import (
    ChatCompletionRequest,
    Message,
)
from gateway.chat.sources import Sources, find_sources
from gateway.chat.tool_stream import new_call_id
from gateway.http.errors import ApiError, guardrail_block
from gateway.http.model_requests import (
    EngineRefusal,
    answer_budget,
    check_token_bias,
    context_error,
    engine_refusal,
    model_engine,
    prompt_tokens,
    refusing_upstream,
)
from gateway.http.off_loop import run_stage
from gateway.keys.store import KeyIdentity
from gateway.limits.quotas import charge
from gateway.policy.runtime import PolicyRuntime
from gateway.services import Services
from gateway.tracing import (
    describe_retrieval,
    describe_verdicts,
    in_span,
    note_policy,
    trace_check,
    traced_deltas,
)
from guardrails import (
    ToolSpec,
    Verdict,
    extract_tool_calls,
    validate_tool_calls,
)
from guardrails.pii import CHECK_NAME as PII
from retrieval import RetrievedChunk


@dataclass
class Choice:
    """One of the `n` answers to a request, as the engine produces it."""

    index: int
    generation: GenerationRequest
    answer_parts: list[str] = field(default_factory=list)
    logprobs: list[TextLogprob] = field(default_factory=list)
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0  # prompt tokens the engine's prefix cache served
    finish_reason: str | None = None


@dataclass
class PreparedChat:
    """A request that passed the input stages and is ready for the engine."""

    completion_id: str
    created: int
    model: str
    engine: Engine  # the engine serving `model`: embedded, or an upstream's
    choices: list[Choice]
    tools: list[ToolSpec]
    shape: OutputShape
    chunks: list[RetrievedChunk]
    entry: AuditEntry
    stream_window: int
    restorable: dict[str, str] = field(default_factory=dict)

    @property
    def first(self) -> Choice:
        return self.choices[0]

    @property
    def cached_prompt_tokens(self) -> int:
        """The prompt is counted once, as the first choice read it (the others share it)."""
        return self.first.cached_prompt_tokens

    def citations(self) -> list[dict[str, Any]]:
        return [
            {
                "index": number,
                "document_id": chunk.document_id,
                "chunk_id": chunk.chunk_id,
                "title": chunk.title,
                "source": chunk.source,
                "score": round(chunk.score, 4),
                "section": chunk.section,
                "page": chunk.page,
                "char_start": chunk.char_start,
                "char_end": chunk.char_end,
            }
            for number, chunk in enumerate(self.chunks, start=1)
        ]


@dataclass
class Answer:
    """What the output stage lets through for one choice.

    `logprobs` is None when they were not asked for; `redacted` says the output checks
    changed the text, so the tokens' own texts must not be shown.
    """

    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    index: int = 0
    cached_prompt_tokens: int = 0
    refusal: str | None = None
    logprobs: list[TextLogprob] | None = None
    redacted: bool = False


@dataclass(frozen=True, slots=True)
class _Screened:
    """A request's texts as the input guardrails let them through."""

    texts: list[str]  # one per message, redacted
    restorable: dict[str, str]  # placeholders the answer may turn back into originals


class ChatService:
    """Runs one chat request through every stage of the request path."""

    def __init__(self, services: Services, runtime: PolicyRuntime) -> None:
        self._services = services
        self._runtime = runtime

    async def charge(self, identity: KeyIdentity, chat: PreparedChat) -> None:
        """Charge the answer's tokens to the caller's token budgets."""
        used = chat.entry.prompt_tokens + chat.entry.completion_tokens
        limits = self._runtime.loaded.policy.rate_limits
        await charge(self._services.limiter, identity, limits, used)

    async def prepare(self, body: ChatCompletionRequest, entry: AuditEntry) -> PreparedChat:
        """Check `body` against the policy, screen it, retrieve its sources and build the
        engine request; every check that refuses it raises `ApiError`."""
        policy = self._runtime.loaded.policy
        engine = model_engine(self._services.models, body.model, policy.model)
        self._record_request(body, entry, engine)
        check_token_bias(engine, bool(body.token_bias))
        check_parameters(body, policy.model, engine.vocab_size)
        max_tokens = self._check_limits(body)
        tools = allowed_tools(body, policy.model)
        shape = shape_for(output_shape(body, tools), engine)
        check_client_schemas(body, tools, policy.structured_output)
        entry.details.update(shape.audit_details())
        bare = [ChatMessage("user", m.text) for m in body.messages]
        await self._check_context(engine, bare, max_tokens, screened=False)
        screened, chunks = await self._screen_input(body, entry)
        messages = engine_messages(
            policy.model.system_prompt,
            body.messages,
            screened.texts,
            chunks,
            tools,
            shape.instruction,
        )
        self._record_prompt(entry, body.messages, screened.texts, chunks)
        generation = self._generation(
            body, entry, messages, max_tokens, shape, policy.model.speculative_decoding
        )
        await self._check_context(engine, generation.messages, max_tokens, screened=True)
        return PreparedChat(
            completion_id=f"chatcmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=engine.model_id,
            engine=engine,
            choices=_choices(generation, body.n),
            tools=tools,
            shape=shape,
            chunks=chunks,
            entry=entry,
            stream_window=policy.output.stream_window_chars,
            restorable=screened.restorable,
        )

    def _record_request(
        self, body: ChatCompletionRequest, entry: AuditEntry, engine: Engine
    ) -> None:
        entry.policy_version = self._runtime.loaded.version
        note_policy(self._runtime.loaded)
        entry.model = engine.model_id
        entry.end_user = body.user

    def _check_limits(self, body: ChatCompletionRequest) -> int:
        """The answer's token budget, once it and the temperature are within the policy."""
        limits = self._runtime.loaded.policy.model
        max_tokens = body.max_completion_tokens or body.max_tokens or limits.max_tokens
        return answer_budget(limits, max_tokens, body.temperature)

    @staticmethod
    async def _check_context(
        engine: Engine, messages: Sequence[ChatMessage], max_tokens: int, screened: bool
    ) -> None:
        """Refuse a prompt that leaves no room for `max_tokens` in `engine`'s context window;
        run once on the bare texts, before sources are added, and once on the prompt. Only
        `screened` (redacted) text may be counted by an upstream."""
        template = engine.count_prompt_tokens([ChatMessage(m.role, "") for m in messages])
        if prompt_token_bound(messages, template) + max_tokens <= engine.context_window:
            return  # most prompts: no tokenizing them on the event loop (4 ms with sources)
        tokens = (
            await prompt_tokens(engine, messages)
            if screened
            else engine.count_prompt_tokens(messages)
        )
        if tokens + max_tokens > engine.context_window:
            exceeded = ContextLengthExceeded(tokens, max_tokens, engine.context_window)
            raise context_error(exceeded, "messages")

    async def _screen_input(
        self, body: ChatCompletionRequest, entry: AuditEntry
    ) -> tuple[_Screened, list[RetrievedChunk]]:
        """Run the input guardrails over every message, and retrieval beside them; a
        blocking verdict refuses the request and stops the retrieval at its next step.

        PII goes first (about 2 ms), so that retrieval searches for the redacted query
        while the injection and topic checks run; when they embed the same text, the
        embedder computes it once for both.
        """
        guardrails = self._runtime.input_guardrails
        policy = self._runtime.loaded.policy
        screens = policy.input.any_enabled()
        texts = [m.text for m in body.messages]
        last_user = next((m.text for m in reversed(body.messages) if m.role == "user"), "")
        roles = [m.role for m in body.messages]
        pii = await run_stage(screens, trace_check, PII, lambda: guardrails.redact(texts))
        query = _last_user_text(body.messages, pii.texts)
        retrieval: asyncio.Future[Sources] | None = None
        cancelled = threading.Event()
        if not pii.verdict.blocks:
            retrieve = in_span(
                "retrieval",
                partial(
                    find_sources,
                    self._services.store,
                    self._runtime.untrusted_text,
                    policy.retrieval,
                    entry.tenant,
                    query,
                    cancelled,
                ),
                describe_retrieval,
            )
            loop = asyncio.get_running_loop()
            if policy.retrieval.enabled:
                # Handed to the pool now (a task would start only at the loop's next turn,
                # behind the checks' own trip to the pool); the context carries its span.
                retrieval = loop.run_in_executor(None, contextvars.copy_context().run, retrieve)
            else:  # off: answered at once, with no task to wait behind the others' turns
                retrieval = loop.create_future()
                retrieval.set_result(retrieve())
        try:
            checked = await run_stage(
                screens,
                partial(guardrails.check, texts, last_user, roles, pii=pii, trace=trace_check),
            )
            if checked.blocking is not None:
                entry.verdicts.extend(checked.verdicts)
                entry.outcome = "blocked"
                raise guardrail_block(checked.blocking.check, _reason(checked.blocking))
        except BaseException:
            cancelled.set()  # the thread stops at its next step; nobody reads its result
            if retrieval is not None:
                retrieval.cancel()
            raise
        entry.verdicts.extend(checked.verdicts)
        assert retrieval is not None, "a blocking PII verdict blocks the whole check"
        sources = await retrieval
        entry.verdicts.extend(sources.dropped)
        return _Screened(list(checked.texts), dict(checked.restorable)), sources.chunks

    def _record_prompt(
        self,
        entry: AuditEntry,
        messages: list[Message],
        texts: list[str],
        chunks: list[RetrievedChunk],
    ) -> None:
        entry.chunk_ids = [c.chunk_id for c in chunks]
        entry.details["documents"] = sorted({c.document_id for c in chunks})
        entry.store_content = self._runtime.loaded.policy.audit.store_content
        entry.prompt_text = "\n".join(
            f"{m.role}: {text}" for m, text in zip(messages, texts, strict=True)
        )

    @staticmethod
    def _generation(
        body: ChatCompletionRequest,
        entry: AuditEntry,
        messages: list[ChatMessage],
        max_tokens: int,
        shape: OutputShape,
        speculative: bool,
    ) -> GenerationRequest:
        sampling = SamplingParams(
            max_tokens=max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            stop=body.stop_sequences,
            presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty,
            logit_bias=body.token_bias,
            logprobs=body.logprobs,
            top_logprobs=body.top_logprobs or 0,
            constraint=shape.constraint,
            speculative=speculative,
        )
        return GenerationRequest(
            request_id=entry.request_id,
            messages=tuple(messages),
            sampling=sampling,
            cache_salt=entry.tenant or "",
        )

    async def stream_text(self, chat: PreparedChat) -> AsyncIterator[str]:
        """The first choice's text as the engine produces it, PII-filtered with a
        held-back window (tool calls too: the stream turns them into call deltas)."""
        if not self._runtime.output.changes_text(chat.restorable):
            # Nothing to check or restore: each delta goes out as it comes, without waiting
            # for a word's end or a hop to a thread (a token's time at the first token).
            async for text in self._generate(chat, chat.first):
                if text:
                    yield text
            return
        redactor = self._runtime.output.streaming(chat.restorable, chat.stream_window)
        release = in_span("output_check.stream_window", redactor.release)
        async for text in self._generate(chat, chat.first):
            # Holding a delta is cheap; only a due check goes to a thread.
            if redactor.add(text) and (released := await asyncio.to_thread(release)):
                yield released
        rest = await asyncio.to_thread(in_span("output_check.stream_window", redactor.flush))
        if rest:
            yield rest

    async def _generate(self, chat: PreparedChat, choice: Choice) -> AsyncIterator[str]:
        """The engine's text deltas of one choice, unfiltered, recorded in `choice` and in
        the audit entry (token counts, finish reason, engine time) as they come."""
        started = time.perf_counter()
        try:
            async for delta in traced_deltas(self._engine_deltas(chat, choice), choice.index):
                chat.entry.prompt_tokens = delta.prompt_tokens
                choice.cached_prompt_tokens = delta.cached_prompt_tokens
                chat.entry.details["cached_prompt_tokens"] = chat.cached_prompt_tokens
                if delta.served_by:
                    chat.entry.upstream = delta.served_by
                choice.completion_tokens = delta.completion_tokens
                chat.entry.completion_tokens = sum(c.completion_tokens for c in chat.choices)
                if delta.finish_reason is not None:
                    choice.finish_reason = delta.finish_reason
                    chat.entry.outcome = delta.finish_reason
                choice.answer_parts.append(delta.text)
                choice.logprobs.extend(delta.logprobs)
                yield delta.text
        finally:
            chat.entry.engine_ms += (time.perf_counter() - started) * 1000

    async def _engine_deltas(self, chat: PreparedChat, choice: Choice) -> AsyncIterator[TokenDelta]:
        """The engine's deltas; its refusals become API errors the client can act on."""
        try:
            async for delta in chat.engine.stream(choice.generation):
                yield delta
        except EngineRefusal as exc:
            chat.entry.upstream = refusing_upstream(exc) or chat.entry.upstream
            raise engine_refusal(exc, "messages") from exc
        except ConstraintError as exc:
            param = "tools" if chat.shape.tool_mode != "none" else "response_format"
            raise ApiError(400, str(exc), param=param, code="invalid_schema") from exc

    async def complete(self, chat: PreparedChat) -> list[Answer]:
        """Run every choice to its end (together: they share the prompt's cached blocks),
        then apply the output checks once to each whole answer (nothing is released early,
        so no window is needed)."""

        async def run(choice: Choice) -> None:
            async for _ in self._generate(chat, choice):
                pass

        await asyncio.gather(*(run(choice) for choice in chat.choices))
        answers = [await self.finish(chat, None, choice) for choice in chat.choices]
        if len(answers) > 1:
            chat.entry.answer_text = json.dumps([a.content or a.tool_calls for a in answers])
        return answers

    async def finish(
        self, chat: PreparedChat, released_text: str | None, choice: Choice | None = None
    ) -> Answer:
        """Decide what the client gets once a choice's generation ended: tool calls or text.

        The output checks run over the whole answer, for the audit record and for answers
        that were held back (`released_text` None: the filtered whole answer is the
        text); a blocking verdict withholds the text.
        """
        choice = choice or chat.first
        raw = "".join(choice.answer_parts)
        output_check = in_span("output_check", self._runtime.output.filter, describe_verdicts)
        checks = self._runtime.output.changes_text(chat.restorable)
        checked = await run_stage(checks, output_check, raw, chat.restorable)
        chat.entry.verdicts.extend(checked.verdicts)
        finish_reason = "length" if choice.finish_reason == "length" else "stop"
        content: str | None = checked.text if released_text is None else released_text
        tool_calls: list[dict[str, Any]] = []
        refusal = None
        if chat.tools:
            content, tool_calls, finish_reason = self._judge_tool_calls(
                chat, checked.text, finish_reason
            )
        if any(v.blocks for v in checked.verdicts) and not tool_calls:
            content, finish_reason = None, "content_filter"
        if chat.shape.json_answer and content is not None and finish_reason == "stop":
            verdict = check_json_answer(content, chat.shape.schema)
            chat.entry.verdicts.append(verdict)
            if verdict.blocks:
                refusal = "The answer was withheld: " + "; ".join(verdict.evidence)
                content, finish_reason = None, "content_filter"
        chat.entry.outcome = "content_filter" if finish_reason == "content_filter" else "ok"
        chat.entry.status_code = 200
        chat.entry.answer_text = content if not tool_calls else json.dumps(tool_calls)
        return Answer(
            content=content,
            tool_calls=tool_calls,
            finish_reason=finish_reason,
            prompt_tokens=chat.entry.prompt_tokens,
            completion_tokens=chat.entry.completion_tokens,
            index=choice.index,
            cached_prompt_tokens=chat.cached_prompt_tokens,
            refusal=refusal,
            logprobs=choice.logprobs if choice.generation.sampling.logprobs else None,
            redacted=checked.text != raw,
        )

    def _judge_tool_calls(
        self, chat: PreparedChat, filtered: str, finish_reason: str
    ) -> tuple[str | None, list[dict[str, Any]], str]:
        """The calls in the answer as the output checks let it through (a redacted
        argument must still meet its schema). An answer cut by `max_tokens` keeps the
        calls it completed and says `length`."""
        calls = extract_tool_calls(filtered)
        if calls is None:
            return filtered, [], finish_reason
        if finish_reason == "length" and calls and calls[-1].parse_error is not None:
            calls = calls[:-1]  # the call max_tokens cut off
            if not calls:
                return None, [], "length"
        mode = self._runtime.loaded.policy.output.tool_calls_mode
        check = validate_tool_calls(calls, chat.tools, mode)
        chat.entry.verdicts.append(check.verdict)
        if check.verdict.action == "block" and mode == "enforce":
            return None, [], "content_filter"
        tool_calls = [
            {
                "id": new_call_id(),
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments_json},
            }
            for call in check.calls
            if call.parse_error is None
        ]
        if not tool_calls:
            return None, [], "content_filter"
        return None, tool_calls, "tool_calls" if finish_reason == "stop" else finish_reason


def _choices(generation: GenerationRequest, n: int) -> list[Choice]:
    """`n` choices of one prompt; a seeded request gives each choice its own seed."""
    if n == 1:
        return [Choice(0, generation)]
    seed = generation.sampling.seed
    return [
        Choice(
            index,
            replace(
                generation,
                request_id=f"{generation.request_id}/{index}",
                sampling=replace(generation.sampling, seed=None if seed is None else seed + index),
            ),
        )
        for index in range(n)
    ]


def _last_user_text(messages: Sequence[Message], texts: Sequence[str]) -> str:
    """The text (of `texts`, one per message) of the last user message, or ""."""
    return next(
        (t for m, t in zip(reversed(messages), reversed(texts), strict=True) if m.role == "user"),
        "",
    )


def _reason(verdict: Verdict) -> str:
    return "; ".join(verdict.evidence) or verdict.check

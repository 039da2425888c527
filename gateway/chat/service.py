"""The chat request path: input guardrails, retrieval, engine, output guardrails.

Each stage is called through its own package's interface; this module only wires them
in order and keeps the audit entry up to date. HTTP concerns stay in `routes`.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from engine import (
    ChatMessage,
    ContextLengthExceeded,
    EngineOverloaded,
    GenerationRequest,
    SamplingParams,
    TokenDelta,
)
from gateway.audit.log import AuditEntry
from gateway.chat.schemas import ChatCompletionRequest, Message
from gateway.http.errors import ApiError, guardrail_block
from gateway.services import PolicyRuntime, Services
from guardrails import (
    StreamingRedactor,
    ToolSpec,
    Verdict,
    extract_tool_calls,
    tool_prompt,
    validate_tool_calls,
)
from retrieval import RetrievedChunk, format_context, select_for_prompt


@dataclass
class PreparedChat:
    """A request that passed the input stages and is ready for the engine."""

    completion_id: str
    created: int
    model: str
    generation: GenerationRequest
    tools: list[ToolSpec]
    chunks: list[RetrievedChunk]
    entry: AuditEntry
    stream_window: int
    restorable: dict[str, str] = field(default_factory=dict)
    answer_parts: list[str] = field(default_factory=list)

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
    """What the output stage lets through for one generation."""

    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int


class ChatService:
    """Runs one chat request through every stage of the request path."""

    def __init__(self, services: Services, runtime: PolicyRuntime) -> None:
        self._services = services
        self._runtime = runtime

    async def prepare(self, body: ChatCompletionRequest, entry: AuditEntry) -> PreparedChat:
        runtime = self._runtime
        policy = runtime.loaded.policy
        engine = self._services.engine
        entry.policy_version = runtime.loaded.version
        entry.model = engine.model_id
        entry.end_user = body.user
        if body.model not in (None, "", engine.model_id):
            raise ApiError(
                404,
                f"The model '{body.model}' does not exist. Available: {engine.model_id}.",
                code="model_not_found",
                param="model",
            )
        max_tokens = body.max_completion_tokens or body.max_tokens or policy.model.max_tokens
        if max_tokens > policy.model.max_tokens:
            raise ApiError(
                400,
                f"max_tokens is {max_tokens}, above this policy's limit of "
                f"{policy.model.max_tokens}.",
                param="max_tokens",
                code="invalid_value",
            )
        limits = policy.model
        if not limits.min_temperature <= body.temperature <= limits.max_temperature:
            raise ApiError(
                400,
                f"temperature must be between {limits.min_temperature} and "
                f"{limits.max_temperature} under this policy.",
                param="temperature",
                code="invalid_value",
            )
        tools = self._declared_tools(body)
        if tools and not limits.allow_tools:
            raise ApiError(400, "Tools are not allowed by this policy.", param="tools")
        if tools and limits.allowed_tools is not None:
            refused = sorted({t.name for t in tools} - set(limits.allowed_tools))
            if refused:
                raise ApiError(
                    400,
                    f"This policy does not allow the tools: {', '.join(refused)}.",
                    param="tools",
                    code="tool_not_allowed",
                )

        texts = [m.text for m in body.messages]
        self._refuse_beyond_context(texts, max_tokens)
        last_user = next((m.text for m in reversed(body.messages) if m.role == "user"), "")
        roles = [m.role for m in body.messages]
        checked = await asyncio.to_thread(runtime.input_guardrails.check, texts, last_user, roles)
        entry.verdicts.extend(checked.verdicts)
        if checked.blocking is not None:
            entry.outcome = "blocked"
            raise guardrail_block(checked.blocking.check, _reason(checked.blocking))
        redacted = list(checked.texts)
        redacted_query = next(
            (
                t
                for m, t in zip(reversed(body.messages), reversed(redacted), strict=True)
                if m.role == "user"
            ),
            "",
        )
        chunks = await asyncio.to_thread(self._retrieve, entry, redacted_query)
        messages = self._engine_messages(body.messages, redacted, chunks, tools)
        entry.chunk_ids = [c.chunk_id for c in chunks]
        entry.details["documents"] = sorted({c.document_id for c in chunks})
        entry.store_content = policy.audit.store_content
        entry.prompt_text = "\n".join(
            f"{m.role}: {text}" for m, text in zip(body.messages, redacted, strict=True)
        )
        sampling = SamplingParams(
            max_tokens=max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            stop=body.stop_sequences,
        )
        generation = GenerationRequest(
            request_id=entry.request_id,
            messages=tuple(messages),
            sampling=sampling,
            cache_salt=entry.tenant or "",
        )
        prompt_tokens = engine.count_prompt_tokens(generation.messages)
        if prompt_tokens + max_tokens > engine.context_window:
            error = ContextLengthExceeded(prompt_tokens, max_tokens, engine.context_window)
            raise ApiError(400, str(error), param="messages", code="context_length_exceeded")
        return PreparedChat(
            completion_id=f"chatcmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=engine.model_id,
            generation=generation,
            tools=tools,
            chunks=chunks,
            entry=entry,
            stream_window=policy.output.stream_window_chars,
            restorable=dict(checked.restorable),
        )

    def _refuse_beyond_context(self, texts: list[str], max_tokens: int) -> None:
        """A request that cannot fit even before sources are added is refused at once."""
        engine = self._services.engine
        tokens = engine.count_prompt_tokens([ChatMessage("user", t) for t in texts])
        if tokens + max_tokens > engine.context_window:
            error = ContextLengthExceeded(tokens, max_tokens, engine.context_window)
            raise ApiError(400, str(error), param="messages", code="context_length_exceeded")

    async def stream_text(self, chat: PreparedChat) -> AsyncIterator[str]:
        """Answer text as the engine produces it, PII-filtered with a held-back window.

        When tools are declared the whole answer is needed to judge a tool call, so
        nothing is released until it is complete.
        """
        redactor = StreamingRedactor(
            self._runtime.output.redactor(chat.restorable), chat.stream_window
        )
        async for text in self._generate(chat):
            if chat.tools:
                continue
            released = await asyncio.to_thread(redactor.feed, text)
            if released:
                yield released
        if not chat.tools:
            rest = await asyncio.to_thread(redactor.flush)
            if rest:
                yield rest

    async def _generate(self, chat: PreparedChat) -> AsyncIterator[str]:
        """The engine's text deltas, unfiltered, recorded in `chat` (answer, token counts,
        finish reason, engine time) as they come."""
        started = time.perf_counter()
        try:
            async for delta in self._engine_deltas(chat):
                chat.entry.prompt_tokens = delta.prompt_tokens
                chat.entry.completion_tokens = delta.completion_tokens
                if delta.finish_reason is not None:
                    chat.entry.outcome = delta.finish_reason
                chat.answer_parts.append(delta.text)
                yield delta.text
        finally:
            chat.entry.engine_ms += (time.perf_counter() - started) * 1000

    async def _engine_deltas(self, chat: PreparedChat) -> AsyncIterator[TokenDelta]:
        """The engine's deltas; its refusals become API errors the client can act on."""
        try:
            async for delta in self._services.engine.stream(chat.generation):
                yield delta
        except EngineOverloaded as exc:
            raise ApiError(
                429,
                str(exc),
                type="rate_limit_error",
                code="engine_overloaded",
                headers={"retry-after": str(max(1, round(exc.retry_after_s)))},
            ) from exc
        except ContextLengthExceeded as exc:
            raise ApiError(400, str(exc), param="messages", code="context_length_exceeded") from exc

    async def complete(self, chat: PreparedChat) -> Answer:
        """Run the engine to the end, then apply the output checks once, to the whole
        answer (nothing is released early, so no window is needed)."""
        async for _ in self._generate(chat):
            pass
        return await self.finish(chat, None)

    async def finish(self, chat: PreparedChat, released_text: str | None) -> Answer:
        """Decide what the client gets once generation ended: tool calls or text.

        The output checks run over the whole answer, for the audit record and for answers
        that were held back (`released_text` None: the filtered whole answer is the
        text); a blocking verdict withholds the text.
        """
        raw = "".join(chat.answer_parts)
        checked = await asyncio.to_thread(self._runtime.output.filter, raw, chat.restorable)
        chat.entry.verdicts.extend(checked.verdicts)
        finish_reason = "length" if chat.entry.outcome == "length" else "stop"
        content: str | None = checked.text if released_text is None else released_text
        tool_calls: list[dict[str, Any]] = []
        if chat.tools:
            content, tool_calls, finish_reason = self._judge_tool_calls(chat, raw, checked.text)
        if any(v.blocks for v in checked.verdicts) and not tool_calls:
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
        )

    def _judge_tool_calls(
        self, chat: PreparedChat, raw: str, filtered: str
    ) -> tuple[str | None, list[dict[str, Any]], str]:
        calls = extract_tool_calls(raw)
        if calls is None:
            return filtered, [], "stop"
        mode = self._runtime.loaded.policy.output.tool_calls_mode
        check = validate_tool_calls(calls, chat.tools, mode)
        chat.entry.verdicts.append(check.verdict)
        if check.verdict.action == "block" and mode == "enforce":
            return None, [], "content_filter"
        tool_calls = [
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments_json},
            }
            for call in check.calls
            if call.parse_error is None
        ]
        if not tool_calls:
            return None, [], "content_filter"
        return None, tool_calls, "tool_calls"

    def _retrieve(self, entry: AuditEntry, query: str) -> list[RetrievedChunk]:
        settings = self._runtime.loaded.policy.retrieval
        if not settings.enabled or not query or entry.tenant is None:
            return []
        found = self._services.store.search(
            entry.tenant, settings.collections, query, settings.top_k, settings.min_score
        )
        # Retrieved text is untrusted: a chunk carrying instructions is dropped, and noted.
        verdicts = self._runtime.untrusted_text.scan_untrusted([c.text for c in found])
        kept: list[RetrievedChunk] = []
        for chunk, verdict in zip(found, verdicts, strict=True):
            if verdict.action == "block":
                entry.verdicts.append(
                    replace(verdict, evidence=(f"chunk {chunk.chunk_id}", *verdict.evidence))
                )
            if not verdict.blocks:
                kept.append(chunk)
        # The prompt numbers sources in this order; citations must use the same numbers.
        return select_for_prompt(kept)

    def _engine_messages(
        self,
        messages: list[Message],
        texts: list[str],
        chunks: list[RetrievedChunk],
        tools: list[ToolSpec],
    ) -> list[ChatMessage]:
        # Stable parts first (policy prompt, tools, sources) so prompts share prefixes.
        policy = self._runtime.loaded.policy
        system_parts = [policy.model.system_prompt]
        if tools:
            system_parts.append(tool_prompt(tools))
        context = format_context(chunks)
        if context:
            system_parts.append(context)
        conversation: list[ChatMessage] = []
        for message, text in zip(messages, texts, strict=True):
            if message.role in ("system", "developer"):
                system_parts.append(text)
            elif message.role == "assistant" and message.tool_calls:
                calls = "".join(
                    _tool_call_markup(c.function.name, c.function.arguments)
                    for c in message.tool_calls
                )
                conversation.append(ChatMessage("assistant", text + calls))
            else:
                role = "tool" if message.role == "tool" else message.role
                conversation.append(ChatMessage(role, text))  # type: ignore[arg-type]
        system = ChatMessage("system", "\n\n".join(p for p in system_parts if p))
        return [system, *conversation]

    @staticmethod
    def _declared_tools(body: ChatCompletionRequest) -> list[ToolSpec]:
        if not body.tools or body.tool_choice == "none":
            return []
        return [
            ToolSpec(
                name=tool.function.name,
                parameters=tool.function.parameters,
                description=tool.function.description,
            )
            for tool in body.tools
        ]


def _reason(verdict: Verdict) -> str:
    return "; ".join(verdict.evidence) or verdict.check


def _tool_call_markup(name: str, arguments: str) -> str:
    """A past tool call, written back in the format the model is told to use."""
    return f'<tool_call>{{"name": {json.dumps(name)}, "arguments": {arguments}}}</tool_call>'

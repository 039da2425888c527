"""The engine's prompt for a chat request: one system message, then the conversation."""

from __future__ import annotations

import json

from engine import ChatMessage
from gateway.chat.schemas import Message
from guardrails import ToolSpec, tool_prompt
from retrieval import RetrievedChunk, format_context


def engine_messages(
    system_prompt: str,
    messages: list[Message],
    texts: list[str],
    chunks: list[RetrievedChunk],
    tools: list[ToolSpec],
    answer_instruction: str = "",
) -> list[ChatMessage]:
    """The prompt for `messages`, read with `texts` (one each, as screened) in their place.

    One system message holds, in this order: the policy's `system_prompt`, the tools, the
    client's own system and developer messages, the answer's format
    (`answer_instruction`), and the retrieved sources. What requests share comes first
    and what changes per request (the sources, then the conversation) last, so that the
    engine's prefix cache serves the shared part; the instruction sits just before the
    sources because it follows the request's `response_format` and tools.
    """
    system_parts = [system_prompt]
    if tools:
        system_parts.append(tool_prompt(tools))
    system_parts.extend(
        text
        for message, text in zip(messages, texts, strict=True)
        if message.role in ("system", "developer")
    )
    system_parts += [answer_instruction, format_context(chunks)]  # empty parts are dropped
    conversation: list[ChatMessage] = []
    called: dict[str, str] = {}  # tool_call_id -> the function it called
    for message, text in zip(messages, texts, strict=True):
        if message.role in ("system", "developer"):
            continue  # already in the system message
        if message.role == "assistant" and message.tool_calls:
            called.update((c.id, c.function.name) for c in message.tool_calls)
            calls = "\n".join(
                _tool_call_markup(c.function.name, c.function.arguments) for c in message.tool_calls
            )
            conversation.append(ChatMessage("assistant", (text + "\n" if text else "") + calls))
        elif message.role == "tool":
            name = called.get(message.tool_call_id or "", "")
            conversation.append(ChatMessage("tool", _tool_response_markup(name, text)))
        else:
            conversation.append(ChatMessage(message.role, text))  # type: ignore[arg-type]
    system = ChatMessage("system", "\n\n".join(p for p in system_parts if p))
    return [system, *conversation]


def _tool_call_markup(name: str, arguments: str) -> str:
    """A past tool call, written back in the format the model is told to use (and that
    its calls are constrained to)."""
    return f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {arguments}}}\n</tool_call>'


def _tool_response_markup(name: str, content: str) -> str:
    """A tool's result, in the Hermes format the model was trained on."""
    result = json.dumps({"name": name, "content": content}, ensure_ascii=False)
    return f"<tool_response>\n{result}\n</tool_response>"

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
) -> list[ChatMessage]:
    """The prompt for `messages`, read with `texts` (one each, as screened) in their place.

    The policy's `system_prompt`, the tools, the sources and the client's own system
    messages form the one system message.
    """
    # Stable parts first (policy prompt, tools, sources) so prompts share prefixes.
    system_parts = [system_prompt]
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
                _tool_call_markup(c.function.name, c.function.arguments) for c in message.tool_calls
            )
            conversation.append(ChatMessage("assistant", text + calls))
        else:
            role = "tool" if message.role == "tool" else message.role
            conversation.append(ChatMessage(role, text))  # type: ignore[arg-type]
    system = ChatMessage("system", "\n\n".join(p for p in system_parts if p))
    return [system, *conversation]


def _tool_call_markup(name: str, arguments: str) -> str:
    """A past tool call, written back in the format the model is told to use."""
    return f'<tool_call>{{"name": {json.dumps(name)}, "arguments": {arguments}}}</tool_call>'

"""The engine's prompt: what requests share (policy prompt, tools, the client's system and
developer messages) comes before what changes per request (sources, conversation), so the
prefix cache can serve it; the model's chat template still sees one system message."""

from __future__ import annotations

from typing import Any

from engine import ChatMessage
from engine.tokenization import encode_chat
from gateway.chat.prompt import engine_messages
from gateway.chat.schemas import Message
from guardrails import ToolSpec
from retrieval import RetrievedChunk

POLICY = "You are the Northwind assistant."
CLIENT_SYSTEM = " ".join(f"Rule {i}: answer politely and cite the handbook." for i in range(40))
TOOLS = [ToolSpec("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}})]


def chunk(chunk_id: int, text: str) -> RetrievedChunk:
    return RetrievedChunk(
        f"doc-{chunk_id}", chunk_id, f"Doc {chunk_id}", f"doc{chunk_id}.md", text, 1.0
    )


def prompt(question: str, chunks: list[RetrievedChunk], instruction: str = "") -> list[ChatMessage]:
    messages = [
        Message(role="system", content=CLIENT_SYSTEM),
        Message(role="developer", content="Keep answers short."),
        Message(role="user", content=question),
    ]
    return engine_messages(POLICY, messages, [m.text for m in messages], chunks, TOOLS, instruction)


def test_system_message_order() -> None:
    system, user = prompt("How many vacation days?", [chunk(1, "27 days.")], "Answer in JSON.")
    assert system.role == "system" and user == ChatMessage("user", "How many vacation days?")
    text = system.content
    order = [
        POLICY,
        "get_weather",
        CLIENT_SYSTEM,
        "Keep answers short.",
        "Answer in JSON.",
        "27 days.",
    ]
    positions = [text.index(part) for part in order]
    assert positions == sorted(positions)


def test_requests_with_different_sources_share_the_client_system_prefix(
    smollm2: tuple[Any, Any],
) -> None:
    """Two requests with the same long system message and different sources: their token
    ids, through the real chat template, agree at least up to the end of that message."""
    _, tokenizer = smollm2
    first = encode_chat(tokenizer, prompt("Vacation?", [chunk(1, "Employees get 27 days.")]))
    second = encode_chat(tokenizer, prompt("Parking?", [chunk(2, "Parking is in lot B.")]))
    common = 0
    while first[common] == second[common]:
        common += 1
    assert common > len(tokenizer.encode(CLIENT_SYSTEM))
    shared = tokenizer.decode(first[:common])
    assert CLIENT_SYSTEM in shared and "Keep answers short." in shared

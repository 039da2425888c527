"""Counting tokens for a model served elsewhere: an estimate, a local tokenizer, or the
upstream's own `/tokenize`.

The `Engine` protocol's counts are synchronous and the gateway calls them on its event
loop, so they never touch the network: with `tokenizer: upstream` they return the estimate,
and the exact count is the engine's async `exact_prompt_tokens` / `exact_text_tokens`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.types import ChatMessage
from engine.upstream.http_client import HTTPClient
from engine.upstream.server_info import server_root

# Chat templates wrap each message in a few tokens (`<|im_start|>role\n`, `<|im_end|>\n`)
# and the prompt in a few more (a default system message, the assistant's opening).
MESSAGE_OVERHEAD = 8
PROMPT_OVERHEAD = 32
BYTES_PER_TOKEN = 3


def estimate_text_tokens(text: str) -> int:
    """UTF-8 bytes / 3, rounded up. Subword tokenizers average about 4 bytes a token on
    English and code, so this overstates typical text by a third: a margin for the context
    check. Not a strict bound (a byte-level tokenizer can spend a token on each byte of
    rare scripts); a prompt it underestimates is refused by the upstream with a 400."""
    return math.ceil(len(text.encode()) / BYTES_PER_TOKEN)


def estimate_prompt_tokens(messages: Sequence[ChatMessage]) -> int:
    """`estimate_text_tokens` of each message, plus the chat template's overhead."""
    return PROMPT_OVERHEAD + sum(
        MESSAGE_OVERHEAD + estimate_text_tokens(m.content) for m in messages
    )


class LocalTokenizer:
    """A transformers tokenizer from a folder, or from a GGUF file's metadata, that the
    upstream model shares: exact counts with its chat template."""

    def __init__(self, path: Path) -> None:
        self._tokenizer = _load(path)

    @property
    def vocab_size(self) -> int:
        return len(self._tokenizer)

    def count_prompt(self, messages: Sequence[ChatMessage]) -> int:
        ids = self._tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages],
            add_generation_prompt=True,
            tokenize=True,
        )
        return len(ids)

    def count_text(self, text: str) -> int:
        return len(self._tokenizer.encode(text))


def _load(path: Path) -> Any:
    if path.is_file() and path.suffix == ".gguf":
        from engine.gguf_file import GGUFFile
        from engine.gguf_model import load_config, load_tokenizer, transformers_fields

        fields = transformers_fields(GGUFFile.open(path))
        return load_tokenizer(fields, load_config(fields), path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))  # type: ignore[no-untyped-call]


async def upstream_text_tokens(
    client: HTTPClient,
    base_url: str,
    upstream_model: str,
    headers: dict[str, str],
    text: str,
    is_llama_cpp: bool,
) -> int:
    """The upstream's count of `text` (special tokens included, as a raw prompt is sent):
    llama.cpp's `POST /tokenize {"content"}`, vLLM's and SGLang's `{"model", "prompt"}`."""
    body: dict[str, Any] = (
        {"content": text, "add_special": True}
        if is_llama_cpp
        else {"model": upstream_model, "prompt": text}
    )
    return await _tokenize(client, base_url, headers, body)


async def upstream_prompt_tokens(
    client: HTTPClient,
    base_url: str,
    upstream_model: str,
    headers: dict[str, str],
    messages: Sequence[ChatMessage],
    is_llama_cpp: bool,
) -> int:
    """The upstream's count of a chat prompt under its own template: vLLM's `/tokenize`
    takes the messages; llama.cpp's applies the template first (`/apply-template`)."""
    turns = [{"role": m.role, "content": m.content} for m in messages]
    if not is_llama_cpp:
        body = {"model": upstream_model, "messages": turns, "add_generation_prompt": True}
        return await _tokenize(client, base_url, headers, body)
    response = await client.request(
        "POST", f"{server_root(base_url)}/apply-template", headers, json_body={"messages": turns}
    )
    response.raise_for_status()
    prompt = response.json()["prompt"]
    # The template already holds the BOS token where the model wants one.
    body = {"content": prompt, "add_special": False, "parse_special": True}
    return await _tokenize(client, base_url, headers, body)


async def _tokenize(
    client: HTTPClient, base_url: str, headers: dict[str, str], body: dict[str, Any]
) -> int:
    response = await client.request(
        "POST", f"{server_root(base_url)}/tokenize", headers, json_body=body
    )
    response.raise_for_status()
    answer = response.json()
    if isinstance(answer.get("count"), int):
        return int(answer["count"])
    return len(answer["tokens"])

"""`tokenizer: local` with a tokenizer folder (what `save_pretrained` writes): the upstream
engine counts a chat prompt and a raw text exactly as that tokenizer does, with its chat
template, and not with the estimate."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from engine import ChatMessage, UpstreamEngine
from engine.gguf_file import GGUFFile
from engine.gguf_model import load_config, load_tokenizer, transformers_fields
from engine.upstream.token_count import estimate_prompt_tokens, estimate_text_tokens
from gateway.models.schema import load_models_file
from tests.engine.upstream.conftest import REFUSED_URL, open_engine, upstream_config
from tests.support.llama_server import smollm2_gguf

MESSAGES = (
    ChatMessage("system", "You answer in one short sentence."),
    ChatMessage("user", "Name three colours, then say which one the sky is on a clear day."),
)
TEXT = "The capital of France is Paris; its river is the Seine."


@pytest.fixture(scope="module")
def reference() -> Any:
    """SmolLM2's tokenizer as transformers builds it from the GGUF file."""
    path = smollm2_gguf()
    fields = transformers_fields(GGUFFile.open(path))
    return load_tokenizer(fields, load_config(fields), path)


@pytest.fixture(scope="module")
def tokenizer_folder(tmp_path_factory: pytest.TempPathFactory, reference: Any) -> Path:
    folder = tmp_path_factory.mktemp("smollm2-tokenizer")
    reference.save_pretrained(str(folder))
    assert (folder / "tokenizer_config.json").is_file()
    return folder


def test_a_tokenizer_folder_counts_as_that_tokenizer_does(
    tmp_path: Path, tokenizer_folder: Path, reference: Any
) -> None:
    models = tmp_path / "models.yaml"
    models.write_text(
        "models:\n  - id: smol\n    upstream:\n"
        f'      base_urls: ["{REFUSED_URL}"]\n      model: smol\n'
        f"      tokenizer: local\n      tokenizer_path: {tokenizer_folder}\n"
    )
    (config,) = load_models_file(models).upstreams
    assert config.tokenizer == "local" and config.tokenizer_path == tokenizer_folder
    engine = UpstreamEngine(config)  # counting never touches the (unreachable) server
    try:
        turns = [{"role": m.role, "content": m.content} for m in MESSAGES]
        expected = len(
            reference.apply_chat_template(turns, add_generation_prompt=True, tokenize=True)
        )
        assert engine.count_prompt_tokens(MESSAGES) == expected
        assert expected != estimate_prompt_tokens(MESSAGES)
        # The folder's chat template is SmolLM2's: each turn opens with <|im_start|>.
        assert expected > len(reference.encode(" ".join(m.content for m in MESSAGES)))
        assert engine.count_text_tokens(TEXT) == len(reference.encode(TEXT))
        assert engine.count_text_tokens(TEXT) != estimate_text_tokens(TEXT)
        assert engine.vocab_size == len(reference) == 49152
    finally:
        engine.close()


def test_the_exact_count_the_gateway_awaits_is_the_folders_too(tokenizer_folder: Path) -> None:
    """`exact_prompt_tokens` (what the gateway awaits before a request leaves) is the local
    count, with no request to the upstream (here nothing listens, so asking would fall
    back to the estimate)."""
    config = upstream_config(REFUSED_URL, tokenizer="local", tokenizer_path=tokenizer_folder)

    async def scenario() -> tuple[int, int, int]:
        async with open_engine(config) as engine:
            return (
                await engine.exact_prompt_tokens(MESSAGES),
                engine.count_prompt_tokens(MESSAGES),
                await engine.exact_text_tokens(TEXT),
            )

    exact, counted, text = asyncio.run(scenario())
    assert exact == counted != estimate_prompt_tokens(MESSAGES)
    assert text != estimate_text_tokens(TEXT)

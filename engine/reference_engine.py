"""The reference engine: a plain KV-cached decode loop over a transformers model.

The paged engine's tests compare against it. One generation runs at a time on a dedicated
worker thread; async callers receive token deltas through a queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog
import torch

from engine.detokenizer import IncrementalDetokenizer
from engine.model_source import ModelSource, load_pretrained
from engine.sampling import apply_logit_bias, sample_next_token
from engine.tokenization import encode_chat, find_stop_token_ids, text_decoder
from engine.types import (
    ChatMessage,
    ConstraintError,
    ContextLengthExceeded,
    GenerationRequest,
    TokenDelta,
)

log = structlog.get_logger(__name__)

_END_OF_STREAM = object()


class TransformersEngine:
    """Runs a causal LM loaded through transformers (HF folder or GGUF) on CPU or CUDA."""

    def __init__(self, model: Any, tokenizer: Any, model_id: str, device: torch.device) -> None:
        self._model = model
        self._tokenizer = tokenizer
        self._model_id = model_id
        self._device = device
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self._stop_token_ids = find_stop_token_ids(tokenizer, model.generation_config)

    @classmethod
    def load(cls, source: ModelSource, device: str | None = None) -> TransformersEngine:
        started = time.perf_counter()
        target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        log.info("engine.loading", model=source.model_id, folder=str(source.folder))
        dtype = torch.bfloat16 if target.type == "cuda" else torch.float32
        model, tokenizer = load_pretrained(source, dtype)
        model = model.to(target).eval()
        log.info(
            "engine.loaded",
            model=source.model_id,
            device=str(target),
            seconds=round(time.perf_counter() - started, 1),
        )
        return cls(model, tokenizer, source.model_id, target)

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def context_window(self) -> int:
        return int(self._model.config.max_position_embeddings)

    @property
    def vocab_size(self) -> int:
        return int(self._model.config.vocab_size)

    def count_prompt_tokens(self, messages: Sequence[ChatMessage]) -> int:
        return len(self._encode_chat(messages))

    def count_text_tokens(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False))

    async def stream(self, request: GenerationRequest) -> AsyncIterator[TokenDelta]:
        if request.sampling.constraint is not None:
            raise ConstraintError("the reference engine does not constrain output")
        if request.prompt is not None:
            prompt_ids = list(self._tokenizer.encode(request.prompt, add_special_tokens=False))
        else:
            prompt_ids = self._encode_chat(request.messages)
        max_tokens = request.sampling.max_tokens
        if len(prompt_ids) + max_tokens > self.context_window:
            raise ContextLengthExceeded(len(prompt_ids), max_tokens, self.context_window)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[object] = asyncio.Queue()
        cancelled = threading.Event()

        def emit(item: object) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        future = loop.run_in_executor(
            self._executor, self._generate, prompt_ids, request, cancelled, emit
        )
        try:
            while True:
                item = await queue.get()
                if item is _END_OF_STREAM:
                    break
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, TokenDelta)
                yield item
        finally:
            cancelled.set()
            with contextlib.suppress(Exception):
                await asyncio.shield(future)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        return encode_chat(self._tokenizer, messages)

    def _generate(
        self,
        prompt_ids: list[int],
        request: GenerationRequest,
        cancelled: threading.Event,
        emit: Callable[[object], None],
    ) -> None:
        try:
            self._decode_loop(prompt_ids, request, cancelled, emit)
        except Exception as exc:  # handed to the awaiting coroutine, which re-raises it
            log.exception("engine.generation_failed", request_id=request.request_id)
            emit(exc)
        finally:
            emit(_END_OF_STREAM)

    @torch.inference_mode()
    def _decode_loop(
        self,
        prompt_ids: list[int],
        request: GenerationRequest,
        cancelled: threading.Event,
        emit: Callable[[object], None],
    ) -> None:
        params = request.sampling
        generator: torch.Generator | None = None
        if params.temperature > 0:
            generator = torch.Generator(device="cpu")
            generator.manual_seed(params.seed if params.seed is not None else time.time_ns())
        detok = IncrementalDetokenizer(text_decoder(self._tokenizer), params.stop)
        prompt_tokens = len(prompt_ids)
        inputs = torch.tensor([prompt_ids], device=self._device)
        past: Any = None
        generated = 0
        finish = "length"
        while generated < params.max_tokens:
            if cancelled.is_set():
                finish = "cancelled"
                break
            out = self._model(input_ids=inputs, past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1].float().cpu()
            apply_logit_bias(logits, params)
            token = sample_next_token(logits, params, generator)
            if token in self._stop_token_ids:
                finish = "stop"
                break
            generated += 1
            text = detok.add(token)
            if detok.stopped:
                emit(TokenDelta(text, generated, prompt_tokens, "stop"))
                return
            if text:
                emit(TokenDelta(text, generated, prompt_tokens))
            inputs = torch.tensor([[token]], device=self._device)
        emit(TokenDelta(detok.flush(), generated, prompt_tokens, finish))  # type: ignore[arg-type]

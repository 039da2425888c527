"""The paged engine behind the `Engine` protocol: an engine thread and async token streams.

The engine thread owns the `EngineCore` and is the only one to touch it. Callers talk to
it through a thread-safe command queue (add, abort, close); each request gets its outputs
back through a callback that hands them to the caller's event loop (or to a plain queue
for synchronous use). Detokenization and stop strings are done on the caller's side.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
import torch
import xgrammar as xgr

from engine.config import EngineConfig, resolve_engine_config
from engine.core import EngineCore, EngineMetrics, StepOutput
from engine.detokenizer import IncrementalDetokenizer
from engine.grammar import COMPILE_TIMEOUT_S, Grammars
from engine.llama import PagedLlama
from engine.model_runner import ModelRunner
from engine.model_source import ModelSource, load_model
from engine.prepared_weights import load_prepared
from engine.smoothing import calibration_ids
from engine.tokenization import ChatEncoder, find_stop_token_ids, text_decoder
from engine.types import (
    ChatMessage,
    Constraint,
    ConstraintError,
    EngineError,
    EngineOverloaded,
    GenerationRequest,
    SamplingParams,
    TextLogprob,
    TokenDelta,
    TokenLogprob,
)

log = structlog.get_logger(__name__)

Sink = Callable[[StepOutput | BaseException], None]


@dataclass(frozen=True, slots=True)
class _Add:
    seq_id: str
    prompt_ids: list[int]
    params: SamplingParams
    cache_salt: str
    sink: Sink
    grammar: xgr.CompiledGrammar | None = None


@dataclass(frozen=True, slots=True)
class _Abort:
    seq_id: str


@dataclass(frozen=True, slots=True)
class _Call:
    """Run a function on the engine thread (inspection and test hooks)."""

    fn: Callable[[EngineCore], Any]
    done: queue.SimpleQueue[Any]


_CLOSE = object()
_METRICS_PERIOD_S = 0.05  # refresh the metrics snapshot at most this often while busy


def _given_config(kv_cache_mb: int | None, config: EngineConfig | None) -> EngineConfig:
    """The caller's config, its KV budget given either directly or in `config`."""
    if config is None:
        return EngineConfig() if kv_cache_mb is None else EngineConfig(kv_cache_mb=kv_cache_mb)
    if kv_cache_mb is not None and config.kv_cache_mb != kv_cache_mb:
        raise ValueError("pass kv_cache_mb either directly or in config, not both")
    return config


def _deliver(sink: Sink, item: StepOutput | BaseException) -> None:
    """Hand an output to its request; a caller whose event loop is gone no longer listens."""
    try:
        sink(item)
    except RuntimeError:
        log.debug("engine.output_dropped", reason="event loop closed")


class PagedEngine:
    """Continuous batching over a paged KV cache, streaming tokens to async callers."""

    def __init__(
        self, core: EngineCore, tokenizer: Any, model_id: str, config: EngineConfig
    ) -> None:
        self._core = core
        self._tokenizer = tokenizer
        self._chat_ids = ChatEncoder(tokenizer)
        self._decode = text_decoder(tokenizer)
        self._model_id = model_id
        self._config = config
        self._commands: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._sinks: dict[str, Sink] = {}
        self._ids = itertools.count()
        self._in_flight = 0
        self._lock = threading.Lock()
        self._metrics = core.metrics()
        self._closed = False
        self._grammars: Grammars | None = None
        self._thread = threading.Thread(target=self._loop, name="paged-engine", daemon=True)
        self._thread.start()

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        source: ModelSource,
        device: str | None = None,
        kv_cache_mb: int | None = None,
        config: EngineConfig | None = None,
    ) -> PagedEngine:
        """Load a model (a GGUF read directly, else through transformers) and serve it
        paged; weights "auto" are resolved for the device (`resolve_engine_config`). A
        GGUF's int8 weights are prepared once and kept (engine/prepared_weights.py)."""
        started = time.perf_counter()
        target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        settings = resolve_engine_config(_given_config(kv_cache_mb, config), target.type)
        log.info(
            "engine.loading",
            model=source.model_id,
            folder=str(source.folder),
            weights=settings.weights,
        )
        prepared = load_prepared(source, target, settings)
        if prepared is not None:
            engine = cls._serve(
                prepared.model,
                prepared.tokenizer,
                prepared.generation_config,
                source.model_id,
                settings,
            )
        else:
            # Compact weights are quantized from full precision, not from a rounded copy.
            quantized = settings.weight_format != "float"
            dtype = torch.float32 if quantized else settings.torch_dtype(target.type)
            hf_model, tokenizer = load_model(source, dtype)
            engine = cls.from_hf_model(
                hf_model, tokenizer, source.model_id, str(target), config=settings
            )
        log.info(
            "engine.loaded",
            model=source.model_id,
            device=str(target),
            kv_blocks=engine._core.blocks.num_blocks,
            seconds=round(time.perf_counter() - started, 1),
        )
        return engine

    @classmethod
    def from_hf_model(
        cls,
        hf_model: Any,
        tokenizer: Any,
        model_id: str,
        device: str | None = None,
        kv_cache_mb: int | None = None,
        config: EngineConfig | None = None,
    ) -> PagedEngine:
        """Serve an already loaded transformers model; `tokenizer` may be None (ids only)."""
        target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        config = resolve_engine_config(_given_config(kv_cache_mb, config), target.type)
        weights = config.weight_format
        calibration = (
            calibration_ids(tokenizer) if weights == "w8a8" and tokenizer is not None else ()
        )
        model = PagedLlama.from_hf(
            hf_model, target, config.torch_dtype(target.type), weights, calibration
        )
        return cls._serve(model, tokenizer, hf_model.generation_config, model_id, config)

    @classmethod
    def _serve(
        cls,
        model: PagedLlama,
        tokenizer: Any,
        generation_config: Any,
        model_id: str,
        config: EngineConfig,
    ) -> PagedEngine:
        runner = ModelRunner.from_config(model, config)
        stop_ids = find_stop_token_ids(tokenizer, generation_config)
        return cls(EngineCore(runner, config, model_id, stop_ids), tokenizer, model_id, config)

    # -- the Engine protocol --------------------------------------------------------------

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def context_window(self) -> int:
        return self._core.context_window

    @property
    def vocab_size(self) -> int:
        return self._core.runner.model.shape.vocab_size

    def count_prompt_tokens(self, messages: Sequence[ChatMessage]) -> int:
        return len(self._chat_ids(messages))

    def count_text_tokens(self, text: str) -> int:
        return len(self._encode_text(text))

    async def stream(self, request: GenerationRequest) -> AsyncIterator[TokenDelta]:
        if request.prompt is not None:
            prompt_ids = self._encode_text(request.prompt)
        else:
            prompt_ids = list(self._chat_ids(request.messages))
        params = request.sampling
        grammar = None
        if params.constraint is not None:
            grammar = await self.compile_constraint(params.constraint)
        detok = IncrementalDetokenizer(self._decode, params.stop)
        pending: list[TextLogprob] = []
        tokens = self.stream_tokens(
            prompt_ids, params, request.cache_salt, request.request_id, grammar
        )
        try:
            async for out in tokens:
                text = ""
                if out.token_id is not None:
                    text = detok.add(out.token_id)
                    if out.logprob is not None:
                        pending.append(self._as_text(out.logprob))
                    if detok.stopped:
                        yield TokenDelta(
                            text,
                            out.num_output_tokens,
                            len(prompt_ids),
                            "stop",
                            tuple(pending),
                            out.num_cached_prompt_tokens,
                            prefill_s=out.prefill_s,
                        )
                        return
                if out.finish_reason is not None:
                    text += detok.flush()
                if text or out.finish_reason is not None:
                    yield TokenDelta(
                        text,
                        out.num_output_tokens,
                        len(prompt_ids),
                        out.finish_reason,
                        tuple(pending),
                        out.num_cached_prompt_tokens,
                        prefill_s=out.prefill_s,
                    )
                    pending = []
        finally:
            await tokens.aclose()

    async def compile_constraint(self, constraint: Constraint) -> xgr.CompiledGrammar:
        """The compiled grammar, off the engine thread; a compile that takes longer than
        COMPILE_TIMEOUT_S is refused (the schema is too hard for the engine to serve)."""
        grammars = self.grammars
        if grammars.cached(constraint):
            return grammars.compile(constraint)
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(grammars.compile, constraint, COMPILE_TIMEOUT_S),
                COMPILE_TIMEOUT_S,
            )
        except TimeoutError as exc:
            raise ConstraintError(
                f"the {constraint.kind} constraint took more than {COMPILE_TIMEOUT_S:g} s "
                "to compile; simplify it"
            ) from exc

    @property
    def grammars(self) -> Grammars:
        """The grammar compiler for this engine's tokenizer, made on first use."""
        if self._tokenizer is None:
            raise ConstraintError("this engine has no tokenizer, so it cannot constrain output")
        with self._lock:
            if self._grammars is None:
                self._grammars = Grammars(
                    self._tokenizer,
                    self._core.runner.model.shape.vocab_size,
                    self._core.stop_token_ids,
                )
            return self._grammars

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._commands.put(_CLOSE)
        self._thread.join(timeout=10)

    # -- token-level API ------------------------------------------------------------------

    async def stream_tokens(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        cache_salt: str = "",
        request_id: str = "",
        grammar: xgr.CompiledGrammar | None = None,
    ) -> AsyncGenerator[StepOutput, None]:
        """Token ids (and logprobs) as they are sampled; closing the iterator aborts.

        `grammar` is `params.constraint` compiled (`compile_constraint`)."""
        loop = asyncio.get_running_loop()
        outputs: asyncio.Queue[StepOutput | BaseException] = asyncio.Queue()

        def sink(item: StepOutput | BaseException) -> None:
            loop.call_soon_threadsafe(outputs.put_nowait, item)

        seq_id = self._submit(prompt_ids, params, cache_salt, request_id, sink, grammar)
        finished = False
        try:
            while not finished:
                item = await outputs.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finish_reason is not None
                yield item
        finally:
            self._release(seq_id, finished)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams],
        cache_salts: Sequence[str] | None = None,
    ) -> list[list[StepOutput]]:
        """Run prompts together and wait for all of them (for tests and benchmarks)."""
        per_prompt = [params] * len(prompts) if isinstance(params, SamplingParams) else params
        salts = cache_salts or [""] * len(prompts)
        inboxes: list[queue.SimpleQueue[StepOutput | BaseException]] = []
        seq_ids = []
        for prompt, p, salt in zip(prompts, per_prompt, salts, strict=True):
            inbox: queue.SimpleQueue[StepOutput | BaseException] = queue.SimpleQueue()
            inboxes.append(inbox)
            grammar = self.grammars.compile(p.constraint) if p.constraint else None
            seq_ids.append(self._submit(prompt, p, salt, "", inbox.put, grammar))
        results: list[list[StepOutput]] = []
        for seq_id, inbox in zip(seq_ids, inboxes, strict=True):
            outs: list[StepOutput] = []
            try:
                while not outs or outs[-1].finish_reason is None:
                    item = inbox.get()
                    if isinstance(item, BaseException):
                        raise item
                    outs.append(item)
            finally:
                self._release(seq_id, bool(outs) and outs[-1].finish_reason is not None)
            results.append(outs)
        return results

    def metrics(self) -> EngineMetrics:
        """The engine's state, refreshed after each step (at most every 50 ms) and when idle."""
        return self._metrics

    def call(self, fn: Callable[[EngineCore], Any]) -> Any:
        """Run `fn(core)` on the engine thread between steps and return its result."""
        done: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._commands.put(_Call(fn, done))
        result = done.get()
        if isinstance(result, BaseException):
            raise result
        return result

    # -- internals ------------------------------------------------------------------------

    def _encode_text(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def _as_text(self, logprob: TokenLogprob) -> TextLogprob:
        return TextLogprob(
            self._decode([logprob.token_id]),
            logprob.logprob,
            tuple((self._decode([token]), value) for token, value in logprob.top),
        )

    def _submit(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        cache_salt: str,
        request_id: str,
        sink: Sink,
        grammar: xgr.CompiledGrammar | None = None,
    ) -> str:
        if self._closed:
            raise EngineError("the engine is closed")
        self._core.check_fits(len(prompt_ids), params)
        capacity = self._config.max_num_seqs + self._config.max_waiting
        with self._lock:
            if self._in_flight >= capacity:
                raise EngineOverloaded(self._in_flight - self._config.max_num_seqs)
            self._in_flight += 1
        seq_id = f"{request_id or 'req'}#{next(self._ids)}"
        if params.constraint is not None and grammar is None:
            raise ConstraintError("a constrained request needs its compiled grammar")
        self._commands.put(_Add(seq_id, list(prompt_ids), params, cache_salt, sink, grammar))
        return seq_id

    def _release(self, seq_id: str, finished: bool) -> None:
        if not finished:
            self._commands.put(_Abort(seq_id))
        with self._lock:
            self._in_flight -= 1

    def _loop(self) -> None:
        core = self._core
        metrics_at = 0.0
        while True:
            command: object | None = self._commands.get() if not core.has_work else None
            try:
                while True:
                    if command is None:
                        command = self._commands.get_nowait()
                    if command is _CLOSE:
                        self._shutdown(EngineError("the engine was closed"))
                        return
                    self._apply(command)
                    command = None
            except queue.Empty:
                pass
            if not core.has_work:
                self._metrics = core.metrics()
                continue
            try:
                outputs = core.step()
            except Exception as exc:  # a failed step fails its requests, not the engine
                log.exception("engine.step_failed")
                self._shutdown(exc, keep_running=True)
                continue
            now = time.monotonic()
            if not core.has_work or now - metrics_at >= _METRICS_PERIOD_S:
                # Before delivery: a caller that saw its last token sees an up-to-date snapshot.
                self._metrics, metrics_at = core.metrics(), now
            for out in outputs:
                sink = self._sinks.get(out.seq_id)
                if sink is not None:
                    _deliver(sink, out)
                if out.finish_reason is not None:
                    self._sinks.pop(out.seq_id, None)

    def _apply(self, command: object) -> None:
        if isinstance(command, _Add):
            try:
                grammar = None
                if command.grammar is not None:
                    grammar = self.grammars.state(command.grammar)
                self._core.add_request(
                    command.seq_id,
                    command.prompt_ids,
                    command.params,
                    command.cache_salt,
                    grammar,
                )
            except EngineError as exc:
                _deliver(command.sink, exc)
                return
            self._sinks[command.seq_id] = command.sink
        elif isinstance(command, _Abort):
            self._core.abort(command.seq_id)
            self._sinks.pop(command.seq_id, None)
        elif isinstance(command, _Call):
            try:
                command.done.put(command.fn(self._core))
            except Exception as exc:
                command.done.put(exc)

    def _shutdown(self, error: BaseException, keep_running: bool = False) -> None:
        for seq_id in self._core.fail_all():
            sink = self._sinks.pop(seq_id, None)
            if sink is not None:
                _deliver(sink, error)
        if not keep_running:
            # Commands queued after close: unblock their callers.
            while True:
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    break
                if isinstance(command, _Add):
                    _deliver(command.sink, error)
                elif isinstance(command, _Call):
                    command.done.put(error)
        self._metrics = self._core.metrics()

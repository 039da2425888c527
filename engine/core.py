"""The engine's synchronous core: admit requests, run steps, report tokens. One thread only."""

from __future__ import annotations

import collections
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.grammar import GrammarState
from engine.model_runner import ModelRunner
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from engine.spec_drafts import SuffixDrafter
from engine.step_times import StepHistogram, StepKind, StepTimes
from engine.types import (
    ContextLengthExceeded,
    EngineError,
    FinishReason,
    SamplingParams,
    TokenLogprob,
)

_RATE_WINDOW_S = 10.0


@dataclass(frozen=True, slots=True)
class StepOutput:
    """What one step did for one sequence: a new token, and/or the end of the sequence."""

    seq_id: str
    token_id: int | None
    logprob: TokenLogprob | None
    num_prompt_tokens: int
    num_output_tokens: int
    finish_reason: FinishReason | None = None
    num_cached_prompt_tokens: int = 0
    prefill_s: float | None = None  # from admission to the first token (Sequence.prefill_s)


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """A snapshot of the engine's load, memory and prefix-cache effectiveness."""

    running: int
    waiting: int
    kv_blocks_total: int
    kv_blocks_used: int
    kv_blocks_free: int
    kv_blocks_cached: int
    prefix_cache_hit_rate: float
    prefix_cache_queried_tokens: int
    prefix_cache_hit_tokens: int
    preemptions: int
    generated_tokens: int
    generation_tokens_per_second: float
    # Speculative decoding: draft tokens verified, and of those the ones accepted.
    draft_tokens: int = 0
    accepted_draft_tokens: int = 0
    steps: int = 0  # steps that ran a batch (tokens per step: generated_tokens / steps)
    # How long steps took: those of single-token rows (decodes and their drafts) and those
    # that also computed prompt tokens (engine/step_times.py).
    step_seconds: Mapping[StepKind, StepHistogram] = field(default_factory=dict)


class EngineCore:
    """Scheduler, block manager and model runner wired together; `step()` runs one batch."""

    def __init__(
        self,
        runner: ModelRunner,
        config: EngineConfig,
        model_id: str,
        stop_token_ids: frozenset[int],
    ) -> None:
        self.runner = runner
        self.config = config
        self.context_window = runner.model.shape.max_positions
        self.blocks = BlockManager(
            runner.pool.num_blocks, config.block_size, model_id, config.enable_prefix_caching
        )
        self.scheduler = Scheduler(config, self.blocks)
        self.stop_token_ids = stop_token_ids
        self._seqs: dict[str, Sequence] = {}
        self._generated = 0
        self._drafted = 0
        self._accepted = 0
        self._steps = 0
        self._step_times = StepTimes()
        # (time, tokens) of the steps of the last _RATE_WINDOW_S, and their tokens' sum: the
        # rate is read without a pass over a window's thousand-odd steps.
        self._recent: collections.deque[tuple[float, int]] = collections.deque()
        self._recent_tokens = 0

    # -- requests -------------------------------------------------------------------------

    def check_fits(self, num_prompt_tokens: int, params: SamplingParams) -> None:
        """Refuse, before queueing, a request that could never run to its end."""
        if num_prompt_tokens <= 0:
            raise EngineError("the prompt is empty")
        vocab = self.runner.model.shape.vocab_size
        if any(not 0 <= token < vocab for token, _ in params.logit_bias):
            raise EngineError(f"logit_bias names a token outside the vocabulary (0 to {vocab - 1})")
        total = num_prompt_tokens + params.max_tokens
        if total > self.context_window:
            raise ContextLengthExceeded(num_prompt_tokens, params.max_tokens, self.context_window)
        if self.blocks.blocks_needed(total) > self.blocks.num_blocks:
            raise EngineError(
                f"{total} tokens need more KV blocks than the pool holds "
                f"({self.blocks.num_blocks} x {self.config.block_size} tokens): "
                "raise BASTION_KV_CACHE_MB or lower max_tokens"
            )

    def add_request(
        self,
        seq_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        cache_salt: str = "",
        grammar: GrammarState | None = None,
    ) -> Sequence:
        """Queue a request; `grammar` constrains its answer (its `params.constraint`)."""
        self.check_fits(len(prompt_ids), params)
        if seq_id in self._seqs:
            raise EngineError(f"request id {seq_id!r} is already running")
        generator = None
        if not params.is_greedy:
            generator = torch.Generator(device="cpu")
            generator.manual_seed(params.seed if params.seed is not None else time.time_ns())
        drafter = None
        if self.config.speculative_tokens and params.speculative:
            drafter = SuffixDrafter(self.config.speculative_tokens)
        seq = Sequence(
            seq_id,
            list(prompt_ids),
            len(prompt_ids),
            params,
            cache_salt,
            generator=generator,
            grammar=grammar,
            drafter=drafter,
        )
        self._seqs[seq_id] = seq
        self.scheduler.add(seq)
        return seq

    def abort(self, seq_id: str) -> bool:
        """Stop a request and free its blocks now. False if it had already finished."""
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            return False
        seq.finish_reason = "cancelled"
        self.scheduler.finish(seq)
        return True

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    @property
    def num_requests(self) -> int:
        return len(self._seqs)

    # -- stepping -------------------------------------------------------------------------

    def step(self) -> list[StepOutput]:
        """Run one batch; report each sampled token and each finished sequence."""
        started = time.monotonic()
        batch = self.scheduler.schedule()
        if not batch:
            return []
        kind: StepKind = "decode"
        if any(seq.num_tokens - seq.num_computed_tokens > 1 for seq, _ in batch.entries):
            kind = "prefill"
        sampled = self.runner.run(batch)
        self._steps += 1
        outputs: list[StepOutput] = []
        finished: list[Sequence] = []
        computed: list[int] = []
        new_tokens = 0
        for (seq, num_new), results in zip(batch.entries, sampled, strict=True):
            kept = 0
            for token, logprob in results or ():
                if seq.prefill_s is None and seq.admitted_at is not None:
                    seq.prefill_s = time.monotonic() - seq.admitted_at
                finish = self._take(seq, token)
                kept += finish != "stop"
                outputs.append(self._output(seq, token, logprob, finish))
                if finish is not None:
                    seq.finish_reason = finish
                    finished.append(seq)
                    break
            new_tokens += kept
            if seq.draft and results:
                accepted = len(results) - 1
                self._drafted += len(seq.draft)
                self._accepted += accepted
                if seq.drafter is not None:
                    seq.drafter.record(len(seq.draft), accepted)
                # K/V is valid for the last token and each accepted draft token kept.
                computed.append(1 + min(kept, accepted))
            else:
                computed.append(num_new)
        self.scheduler.after_step(batch, computed)
        for seq in finished:
            self._seqs.pop(seq.seq_id, None)
            self.scheduler.finish(seq)
        self._count(new_tokens)
        self._step_times.observe(kind, time.monotonic() - started)
        return outputs

    def _take(self, seq: Sequence, token: int) -> FinishReason | None:
        """Append a sampled token to `seq` unless it stops it; why `seq` ends, if it does."""
        finish = self._finish_reason(seq, token)
        grammar = seq.grammar
        # A refused token comes only from a mask that allowed nothing; an accepted stop token
        # (one ignore_eos let through) leaves a grammar that takes no more text and has no
        # mask for a next step. Either way the answer is complete as it stands.
        if finish is None and grammar is not None:
            finish = None if grammar.accept(token) and not grammar.is_terminated else "stop"
        if finish != "stop":
            seq.token_ids.append(token)
            if finish is None and seq.num_output_tokens >= seq.params.max_tokens:
                finish = "length"
        return finish

    @staticmethod
    def _output(
        seq: Sequence, token: int, logprob: TokenLogprob | None, finish: FinishReason | None
    ) -> StepOutput:
        emitted = token if finish != "stop" else None
        return StepOutput(
            seq.seq_id,
            emitted,
            logprob if emitted is not None else None,
            seq.num_prompt_tokens,
            seq.num_output_tokens,
            finish,
            seq.num_cached_prompt_tokens,
            seq.prefill_s,
        )

    def fail_all(self) -> list[str]:
        """Drop every request after an unrecoverable step error; returns their ids."""
        ids = list(self._seqs)
        for seq_id in ids:
            self.abort(seq_id)
        return ids

    def _finish_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        params = seq.params
        if token in params.stop_token_ids:
            return "stop"
        if not params.ignore_eos and token in self.stop_token_ids:
            return "stop"
        return None

    def _count(self, new_tokens: int) -> None:
        now = time.monotonic()
        self._generated += new_tokens
        self._recent.append((now, new_tokens))
        self._recent_tokens += new_tokens
        self._forget_steps_before(now - _RATE_WINDOW_S)

    def _forget_steps_before(self, cutoff: float) -> None:
        while self._recent and self._recent[0][0] < cutoff:
            self._recent_tokens -= self._recent.popleft()[1]

    # -- metrics --------------------------------------------------------------------------

    def metrics(self) -> EngineMetrics:
        counts = self.blocks.counts()
        now = time.monotonic()
        self._forget_steps_before(now - _RATE_WINDOW_S)
        recent = self._recent
        rate = 0.0
        if len(recent) > 1 and now > recent[0][0]:
            # Tokens of the steps after the first one in the window, over the time since it.
            rate = (self._recent_tokens - recent[0][1]) / (now - recent[0][0])
        return EngineMetrics(
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            kv_blocks_total=counts.total,
            kv_blocks_used=counts.used,
            kv_blocks_free=counts.free,
            kv_blocks_cached=counts.cached,
            prefix_cache_hit_rate=self.blocks.hit_rate,
            prefix_cache_queried_tokens=self.blocks.prefix_queries,
            prefix_cache_hit_tokens=self.blocks.prefix_hits,
            preemptions=self.scheduler.num_preemptions,
            generated_tokens=self._generated,
            generation_tokens_per_second=rate,
            draft_tokens=self._drafted,
            accepted_draft_tokens=self._accepted,
            steps=self._steps,
            step_seconds=self._step_times.snapshot(),
        )

"""One request inside the engine: its tokens, how many have KV, and where that KV lives."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import torch

from engine.grammar import GrammarState
from engine.speculative import Drafter
from engine.types import FinishReason, SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False, slots=True)
class Sequence:
    """A prompt and its growing completion.

    `num_computed_tokens` counts tokens whose K/V are in the cache; the rest of
    `token_ids` still has to go through the model. After preemption it drops to zero and
    the sequence is recomputed (prompt and completion so far) when it runs again; its
    `grammar` has accepted every output token and needs no rebuilding.

    `drafter` proposes speculative tokens where speculation is on for it; `draft` holds the
    ones this step verifies (after `token_ids`, never part of them until accepted).
    """

    seq_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    cache_salt: str = ""
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    num_cached_prompt_tokens: int = 0
    num_preemptions: int = 0
    finish_reason: FinishReason | None = None
    generator: torch.Generator | None = None
    grammar: GrammarState | None = None
    drafter: Drafter | None = None
    draft: list[int] = field(default_factory=list)
    # Tracing's split of the wait for the first token: when the scheduler first admitted
    # it (time.monotonic()), and the seconds from then to its first token.
    admitted_at: float | None = None
    prefill_s: float | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

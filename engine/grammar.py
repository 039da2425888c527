"""Grammar-constrained decoding with xgrammar: compile a constraint, mask logits, track state.

xgrammar was picked over llguidance by measuring both on SmolLM2's 49k-token vocabulary
(bench/grammar_backends.py, figures in docs/benchmarks.md). The compiled grammars live in
a bounded LRU keyed by `Constraint.key`; each sequence gets its own matcher, which
accepts every sampled token and so survives preemption (recompute rebuilds the KV cache,
not the output, so the matcher's state stays right). A speculative draft is walked through
the matcher and rolled back: once to cut it at the first token the grammar forbids, once to
fill the mask of each position it is verified at.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import xgrammar as xgr

from engine.types import Constraint, ConstraintError

DEFAULT_GRAMMAR_CACHE_SIZE = 256
# A schema that takes longer than this to compile is refused rather than served.
COMPILE_TIMEOUT_S = 0.5
# JSON answers are compact: no whitespace between tokens, so that a schema answer cannot
# spend its tokens on blanks.
_COMPACT = (",", ":")
# xgrammar (0.1.x) writes a string with maxLength as repeats of this class, which lets raw
# control characters (a tab, say) into the string, where JSON allows them only escaped (RFC
# 8259, section 7), so the answer would not parse; its strings without a length bound
# exclude them, as the class below does.
_LOOSE_STRING_CHARACTER = r"[^\"\\\r\n]"
_JSON_STRING_CHARACTER = r"[^\0-\x1f\"\\]"
# float32 -inf's bits: a token mask adds 0 to an allowed token's logit and -inf to the rest.
_NEG_INF_BITS = np.uint32(0xFF800000)


class GrammarState:
    """One sequence's position in its grammar."""

    def __init__(
        self, compiled: xgr.CompiledGrammar, stop_token_ids: Sequence[int], vocab_size: int
    ) -> None:
        self._matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=list(stop_token_ids))
        self.vocab_size = vocab_size

    def accept(self, token_id: int) -> bool:
        """Advance past a sampled token; False if the grammar does not allow it."""
        return bool(self._matcher.accept_token(token_id))

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and its stop token was accepted."""
        return bool(self._matcher.is_terminated())

    def allowed_prefix(self, draft: Sequence[int]) -> list[int]:
        """The start of `draft` that the grammar accepts from here, up to the first token it
        forbids: verification masks that token, so it could never be accepted."""
        matcher = self._matcher
        allowed = 0
        for token in draft:
            if matcher.is_terminated() or not matcher.accept_token(token):
                break
            allowed += 1
        if allowed:
            matcher.rollback(allowed)
        return list(draft[:allowed])

    def fill_masks(self, bitmask: torch.Tensor, row: int, draft: Sequence[int] = ()) -> None:
        """Fill `row` with the tokens allowed next, and each of the `len(draft)` rows after
        it with those allowed after the draft up to that position (`allowed_prefix`'s
        tokens only)."""
        matcher = self._matcher
        matcher.fill_next_token_bitmask(bitmask, row)
        walked = 0
        for token in draft:
            matcher.accept_token(token)
            walked += 1
            if matcher.is_terminated():
                break  # a stop token: xgrammar has no mask after it, the answer ends there
            matcher.fill_next_token_bitmask(bitmask, row + walked)
        if walked:
            matcher.rollback(walked)


class Grammars:
    """Compiles constraints for one tokenizer; thread-safe, with a bounded LRU of results."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: Iterable[int],
        cache_size: int = DEFAULT_GRAMMAR_CACHE_SIZE,
    ) -> None:
        self.stop_token_ids = tuple(sorted(stop_token_ids))
        self.vocab_size = vocab_size
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=list(self.stop_token_ids)
        )
        # One compile thread: compiles run beside the engine thread on a small machine.
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self._cache: OrderedDict[str, xgr.CompiledGrammar] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        # One compile at a time: a compile cannot be interrupted, so one that runs away
        # holds one core, never all of them; the others wait at most `wait_s` for it.
        self._compiling = threading.Lock()
        self.compiles = 0

    def compile(self, constraint: Constraint, wait_s: float = -1) -> xgr.CompiledGrammar:
        """The compiled grammar of `constraint`, from the cache when it was compiled before;
        ConstraintError when another compile holds the compiler for more than `wait_s`
        (-1: wait as long as it takes)."""
        key = constraint.key
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
        if not self._compiling.acquire(timeout=wait_s):
            raise ConstraintError("another constraint is still compiling; retry shortly")
        try:
            compiled = self._compile(constraint)
        finally:
            self._compiling.release()
        with self._lock:
            self.compiles += 1
            self._cache[key] = compiled
            self._cache.move_to_end(key)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return compiled

    def cached(self, constraint: Constraint) -> bool:
        with self._lock:
            return constraint.key in self._cache

    def state(self, compiled: xgr.CompiledGrammar) -> GrammarState:
        return GrammarState(compiled, self.stop_token_ids, self.vocab_size)

    def _compile(self, constraint: Constraint) -> xgr.CompiledGrammar:
        compiler = self._compiler
        try:
            if constraint.kind == "json_schema":
                return compiler.compile_grammar(json_schema_grammar(constraint.source))
            if constraint.kind == "json_object":
                return compiler.compile_grammar(json_schema_grammar('{"type": "object"}'))
            if constraint.kind == "regex":
                return compiler.compile_regex(constraint.source)
            if constraint.kind == "grammar":
                return compiler.compile_grammar(constraint.source)
            return compiler.compile_structural_tag(constraint.source)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise ConstraintError(f"the {constraint.kind} constraint is invalid: {exc}") from exc


@dataclass(frozen=True, slots=True)
class GrammarRows:
    """A constrained sequence's logit rows in a step: `row` for its next token and, when it
    verifies a draft, one row after each draft token (engine/speculative.py)."""

    row: int
    state: GrammarState
    draft: tuple[int, ...] = ()

    @property
    def rows(self) -> range:
        return range(self.row, self.row + len(self.draft) + 1)


def fill_masks(num_rows: int, constrained: Sequence[GrammarRows]) -> torch.Tensor:
    """The additive token masks of a step's logit rows, `[num_rows, vocab]` float32: 0
    where a row's grammar allows the token, -inf where it does not (0 in the rows of
    unconstrained sequences).

    They depend only on the grammars' states, so they are filled while the model runs, and
    made additive there too: on the sampling path they cost one vectorised add, where
    xgrammar's CPU kernel took 0.1-0.2 ms a row (bench/structured.py).
    """
    vocab = _vocab_of(constrained)
    bitmask = xgr.allocate_token_bitmask(num_rows, vocab)
    for rows in constrained:
        rows.state.fill_masks(bitmask, rows.row, rows.draft)
    # Bit j of int32 word i is token 32 * i + j; little-endian bytes keep that order.
    bits = np.unpackbits(bitmask.numpy().view(np.uint8), axis=-1, bitorder="little")
    masks = bits[:, :vocab].astype(np.uint32)
    masks -= 1  # an allowed token's 1 becomes 0, a forbidden one's 0 all ones...
    masks &= _NEG_INF_BITS  # ...then -inf's bits
    return torch.from_numpy(masks.view(np.float32))


def apply_masks(logits: torch.Tensor, masks: torch.Tensor, rows: Sequence[int]) -> None:
    """Forbid, in place, the tokens each of `rows` (of [rows, vocab] float32 CPU logits)
    may not take: adds `fill_masks`'s rows.

    NumPy's add runs on the calling thread; PyTorch's would share the step's intra-op
    threads, which cost milliseconds for this much work on busy cores.
    """
    if not rows:
        return
    values, additions = logits.numpy(), masks.numpy()
    if len(rows) == len(values):
        np.add(values, additions, out=values)
        return
    for row in rows:
        np.add(values[row], additions[row], out=values[row])


def _vocab_of(constrained: Sequence[GrammarRows]) -> int:
    return constrained[0].state.vocab_size if constrained else 32


def json_schema_grammar(schema: str) -> str:
    """The EBNF grammar of compact JSON that follows `schema`, strings free of raw control
    characters."""
    grammar = xgr.Grammar.from_json_schema(schema, any_whitespace=False, separators=_COMPACT)
    return str(grammar).replace(_LOOSE_STRING_CHARACTER, _JSON_STRING_CHARACTER)

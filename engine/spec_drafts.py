"""Speculative drafts from the longest earlier match: a suffix automaton over prompt + answer.

A RAG answer copies runs of tokens from the sources in its prompt, and from itself. The
automaton finds, in amortised constant time a token, the longest suffix of the sequence that
occurred before and where it last ended; the tokens that followed it are the draft. Its
length follows what a verification step costs in the native int8 kernel (at a 600-token
context about 1.0 for one row, 1.25 for 3, 1.35 for 4, 1.75 for 6, 2.2 for 8 on AVX-512;
1.3 for 3, 1.7 for 4, 2.3 for 6, 3.1 for 8 on AVX2), and how well the draft is likely to
be kept: the longer the match, the longer the draft, and the less of the sequence's drafts
has been kept lately, the shorter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

# Draft lengths by the length of the match they continue, longest match first. On the RAG
# answers of bench/speculative.py (one stream, two runs each), against the same engine
# without drafts: 3 tokens after a match of 2 or more and 1 after a match of 1 gave
# 1.80x/1.75x and 1.75x/1.92x; these, 1.84x/2.02x; 5 after a match of 4 or more,
# 1.78x/1.84x and 1.93x/2.37x; 7 after a match of 4 or more, 1.75x/2.00x.
DRAFT_BY_MATCH = ((8, 7), (4, 5), (2, 3), (1, 1))
LONGEST_DRAFT = DRAFT_BY_MATCH[0][1]
# The longest draft by the sequence's measured acceptance (the share of its drafted tokens
# kept, a moving average over its verified drafts), highest first. Were each drafted token
# kept at rate a independently, a draft of k would buy (1 - a^(k+1)) / (1 - a) tokens a
# step for the cost above, and below a = 0.5 one token would be best. But a long match is
# kept far more often than the average says (the misses come mostly after short matches),
# so the cap steps down gently: 3 tokens below a half, 1 below a quarter.
DRAFT_BY_ACCEPTANCE = ((0.5, LONGEST_DRAFT), (0.25, 3), (0.0, 1))
# The newest draft's weight in the moving average: a few drafts move it.
_ACCEPTANCE_WEIGHT = 0.25
# A sequence whose drafts keep failing stops drafting for a while, longer each time. A
# one-token draft's second row costs about a tenth of a step, so it pays while about one
# draft in eight is accepted; pausing sooner cost more than it saved on the RAG answers.
_MISSES_BEFORE_PAUSE = 8
_FIRST_PAUSE_STEPS = 4
_LONGEST_PAUSE_STEPS = 64
# How many shorter suffixes learn the newest end position of theirs each token: the most
# recent occurrence predicts better than the first (a phrase the answer already took from
# one source continues as it did there), and the bound keeps a token's cost constant.
_RECENCY_DEPTH = 64


def draft_length(match: int) -> int:
    """How many tokens to draft after a match of `match` >= 1 tokens."""
    return next(draft for shortest, draft in DRAFT_BY_MATCH if match >= shortest)


def longest_draft_for(acceptance: float) -> int:
    """The longest draft for a sequence whose drafts keep `acceptance` of their tokens."""
    return next(draft for lowest, draft in DRAFT_BY_ACCEPTANCE if acceptance >= lowest)


@dataclass(slots=True)
class SuffixAutomaton:
    """The suffix automaton of a growing token sequence.

    State 0 is the empty string; each state is a class of substrings with the same end
    positions: `length` is its longest, `link` the state of its longest suffix in another
    class, `end` a position where it ends (the latest known, before the newest token).
    """

    _next: list[dict[int, int]] = field(default_factory=lambda: [{}])
    _link: list[int] = field(default_factory=lambda: [-1])
    _length: list[int] = field(default_factory=lambda: [0])
    _end: list[int] = field(default_factory=lambda: [-1])
    _last: int = 0
    size: int = 0

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens to the sequence."""
        for token in tokens:
            self._append(token)

    def longest_repeat(self) -> tuple[int, int]:
        """(length, end) of the longest suffix that also ends earlier, at `end`; (0, -1)
        if the newest token never occurred before."""
        state = self._link[self._last]
        if state <= 0:
            return 0, -1
        return self._length[state], self._end[state]

    def _append(self, token: int) -> None:
        nexts, link, length, end = self._next, self._link, self._length, self._end
        position = self.size
        self.size += 1
        # Every suffix of the sequence so far also ends at the previous position: record it
        # now, one token late, so that longest_repeat never answers the newest position.
        state, depth = link[self._last], 0
        while state > 0 and depth < _RECENCY_DEPTH:
            end[state] = position - 1
            state, depth = link[state], depth + 1
        cur = len(length)
        nexts.append({})
        link.append(0)
        length.append(length[self._last] + 1)
        end.append(position)
        p = self._last
        while p != -1 and token not in nexts[p]:
            nexts[p][token] = cur
            p = link[p]
        if p != -1:
            q = nexts[p][token]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:
                clone = len(length)
                nexts.append(dict(nexts[q]))
                link.append(link[q])
                length.append(length[p] + 1)
                end.append(end[q])
                while p != -1 and nexts[p].get(token) == q:
                    nexts[p][token] = clone
                    p = link[p]
                link[q] = clone
                link[cur] = clone
        self._last = cur


@dataclass(slots=True)
class SuffixDrafter:
    """One sequence's draft proposer: the continuation of its longest earlier match, its
    length chosen by the match's length, capped by the measured acceptance and at
    `max_tokens`; paused after repeated misses."""

    max_tokens: int
    _automaton: SuffixAutomaton = field(default_factory=SuffixAutomaton)
    _misses: int = 0
    _pause: int = 0
    _paused_for: int = _FIRST_PAUSE_STEPS
    proposed: int = 0
    accepted: int = 0
    acceptance: float = 1.0  # moving average of the share of each draft kept

    def propose(self, token_ids: Sequence[int], limit: int) -> list[int]:
        """Up to `limit` tokens that may follow `token_ids`; [] if none."""
        automaton = self._automaton
        automaton.extend(token_ids[automaton.size :])
        if self._pause > 0:
            self._pause -= 1
            return []
        length, end = automaton.longest_repeat()
        if length == 0:
            return []
        wanted = min(
            draft_length(length), longest_draft_for(self.acceptance), self.max_tokens, limit
        )
        return list(token_ids[end + 1 : end + 1 + wanted]) if wanted > 0 else []

    def record(self, drafted: int, accepted: int) -> None:
        """Count a verified draft; pause drafting after repeated misses, longer each time."""
        self.proposed += drafted
        self.accepted += accepted
        if drafted > 0:
            kept = accepted / drafted
            self.acceptance += _ACCEPTANCE_WEIGHT * (kept - self.acceptance)
        if accepted > 0:
            self._misses = 0
            self._paused_for = _FIRST_PAUSE_STEPS
            return
        self._misses += 1
        if self._misses >= _MISSES_BEFORE_PAUSE:
            self._misses = 0
            self._pause = self._paused_for
            self._paused_for = min(2 * self._paused_for, _LONGEST_PAUSE_STEPS)

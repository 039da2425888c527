"""System-prompt and canary-string leaks in model output.

A canary is a random marker the operator puts in the system prompt (`new_canary`); seeing
it in an answer proves the prompt leaked. Without one, a run of `ngram_words` consecutive
words of the system prompt in the answer counts as a leak (case and punctuation ignored),
and the leaked words are replaced. While streaming, the window should exceed that many
words (about 8 characters a word) so a leak is caught before its start is released.
"""

from __future__ import annotations

import re
import secrets

from guardrails.config import LeakConfig
from guardrails.verdict import Filtered, Verdict, run_output_filter

CHECK_NAME = "prompt_leak"
CANARY_MARKER = "<CANARY>"
LEAK_MARKER = "[system prompt withheld]"
_WORD = re.compile(r"\w+")
_MIN_PROMPT_WORDS = 4


def new_canary() -> str:
    """A fresh random canary string to embed in a system prompt."""
    return f"bastion-canary-{secrets.token_hex(8)}"


class LeakDetector:
    """Finds canaries and system-prompt passages in an answer and masks them."""

    def __init__(self, config: LeakConfig, system_prompt: str = "") -> None:
        self._config = config
        self._canaries = [
            re.compile(re.escape(c), re.IGNORECASE) for c in config.canaries if c.strip()
        ]
        # Canaries with no whitespace cannot cross a word boundary still held.
        self._canaries_cross_words = any(re.search(r"\s", c) for c in config.canaries)
        words = [w.lower() for w in _WORD.findall(system_prompt)]
        self._n = min(config.ngram_words, len(words))
        self._ngrams: set[tuple[str, ...]] = set()
        self._prompt_words: list[str] = []
        self._positions: dict[str, list[int]] = {}
        if len(words) >= _MIN_PROMPT_WORDS:
            self._ngrams = {tuple(words[i : i + self._n]) for i in range(len(words) - self._n + 1)}
            self._prompt_words = words
            for i, word in enumerate(words):
                self._positions.setdefault(word, []).append(i)

    @property
    def config(self) -> LeakConfig:
        return self._config

    def hold_from(self, text: str) -> int | None:
        """Where the end of a streamed answer may still be the start of a leak: its
        trailing words that run on, in order, somewhere in the system prompt (`len(text)`
        when none do). None when a canary holds whitespace, so only the window is safe."""
        if self._canaries_cross_words:
            return None
        words = list(_WORD.finditer(text))
        hold = len(text)
        # Prompt positions where the trailing run, from this word to the end, starts.
        starts: list[int] | None = None
        for word in reversed(words):
            lowered = word.group().lower()
            if starts is None:
                starts = self._positions.get(lowered, [])
            else:
                starts = [p - 1 for p in starts if p > 0 and self._prompt_words[p - 1] == lowered]
            if not starts:
                break
            hold = word.start()
        return hold

    def filter(self, text: str) -> Filtered:
        return run_output_filter(CHECK_NAME, self._config, text, self._filter)

    def _filter(self, text: str) -> Filtered:
        mode = self._config.mode
        spans: list[tuple[int, int, str]] = []
        for canary in self._canaries:
            spans += [(m.start(), m.end(), CANARY_MARKER) for m in canary.finditer(text)]
        leaked_ngrams = 0
        if self._ngrams:
            words = list(_WORD.finditer(text))
            for i in range(len(words) - self._n + 1):
                gram = tuple(w.group().lower() for w in words[i : i + self._n])
                if gram in self._ngrams:
                    leaked_ngrams += 1
                    spans.append((words[i].start(), words[i + self._n - 1].end(), LEAK_MARKER))
        if not spans:
            return Filtered(text, Verdict(CHECK_NAME, "allow", 0.0, (), mode))
        merged = _merge(spans)
        evidence = []
        canaries = sum(1 for *_, marker in spans if marker == CANARY_MARKER)
        if canaries:
            evidence.append(f"canary string x{canaries}")
        if leaked_ngrams:
            share = leaked_ngrams / len(self._ngrams)
            evidence.append(
                f"system prompt: {leaked_ngrams} runs of {self._n} words ({share:.0%} of it)"
            )
        score = 1.0 if canaries else min(1.0, 0.5 + leaked_ngrams / len(self._ngrams))
        verdict = Verdict(CHECK_NAME, "block", score, tuple(evidence), mode)
        if mode != "enforce":
            return Filtered(text, verdict)
        parts, cursor = [], 0
        for start, end, marker in merged:
            parts += [text[cursor:start], marker]
            cursor = end
        parts.append(text[cursor:])
        return Filtered("".join(parts), verdict)


def _merge(spans: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Overlapping spans merged; a canary inside a leaked passage is masked as a leak."""
    merged: list[tuple[int, int, str]] = []
    for start, end, marker in sorted(spans):
        if merged and start <= merged[-1][1]:
            last_start, last_end, last_marker = merged[-1]
            keep = LEAK_MARKER if LEAK_MARKER in (marker, last_marker) else last_marker
            merged[-1] = (last_start, max(end, last_end), keep)
        else:
            merged.append((start, end, marker))
    return merged

"""A tolerant matcher for the "ignore previous instructions" family, for lossy obfuscation.

The regex layer needs each word spelled out; "ign0r all prev instrctns" drops and swaps
letters, which no exact reading restores. Here every word is de-leeted (digits and symbols
read as letters) and compared with the key words by edit distance, or as an abbreviation
(a prefix, or the word with vowels dropped). A match still needs the verb, a "previous"
word and a "rules" word in that order within a few words, as the regex does, so
"ignore the previous email" passes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_WORD = re.compile(r"[a-z0-9@$!|]+")
_DELEET = str.maketrans("0134579@$!|", "oieastgasil")
_GAP = 3  # words allowed between the verb and the "previous" word (all, of, your ...)

_VERBS = ("ignore", "disregard", "forget", "override", "bypass")
_VERB_INITIALS = frozenset(verb[0] for verb in _VERBS)
_PRIOR = ("previous", "prior", "above", "earlier", "preceding", "system", "original")
_RULES = ("instructions", "instruction", "rules", "prompt", "directives", "guidelines")


def _edit_distance(a: str, b: str, limit: int) -> int:
    """Damerau-Levenshtein (adjacent swaps count once), cut off above `limit`."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                current[j] = min(current[j], previous2[j - 2] + 1)
        if min(current) > limit:
            return limit + 1
        previous2, previous = previous, current
    return previous[-1]


def _is_subsequence(short: str, long: str) -> bool:
    letters = iter(long)
    return all(ch in letters for ch in short)


def _like(token: str, key: str) -> bool:
    """`token` is `key` misspelt by a letter or two, or abbreviated from it."""
    if token[0] != key[0] or len(token) < 3:
        return False
    if token == key:
        return True
    limit = 1 if len(key) <= 6 else 2
    if _edit_distance(token, key, limit) <= limit:
        return True
    # Abbreviations: "prev", "instrctns", "instr"; at least 4 letters and half the word.
    return len(token) >= 4 and 2 * len(token) >= len(key) and _is_subsequence(token, key)


def _like_any(token: str, keys: Iterable[str]) -> bool:
    return any(_like(token, key) for key in keys)


# Real words a letter away from a verb, which report rather than instruct.
_NOT_VERBS = frozenset(["forgot", "forge", "forger", "forgets", "ignorant", "overrode"])
# A cheap screen: most texts have no word that can start one of the verbs.
_VERB_START = re.compile(r"(?<![a-z0-9])(?:[i1!|][gq9]|d[i1!|]?s|f[o0]rg|[o0]v[e3]r|byp)")


def _like_verb(token: str) -> bool:
    """A misspelt verb, but not an inflected one: "he ignored previous instructions"
    reports, it does not instruct."""
    if token in _NOT_VERBS or token.endswith(("ed", "ing", "es")):
        return False
    return _like_any(token, _VERBS)


def fuzzy_ignore_instructions(text: str) -> str | None:
    """The matched words when `text` (already normalised) tells the model, however
    misspelt, to ignore its previous instructions; None otherwise."""
    if not _VERB_START.search(text):
        return None
    words = [w.translate(_DELEET) for w in _WORD.findall(text)]
    for i, word in enumerate(words):
        if word[0] not in _VERB_INITIALS or not _like_verb(word):
            continue
        for j in range(i + 1, min(i + 2 + _GAP, len(words) - 1)):
            if _like_any(words[j], _PRIOR) and _like_any(words[j + 1], _RULES):
                return " ".join(words[i : j + 2])
    return None

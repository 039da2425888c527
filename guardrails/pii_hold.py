"""How much of a streamed answer's end the PII check still needs, for the default entities.

A stream can release text up to a word boundary only once no entity can cross that
boundary, whatever the model writes next. E-mail and IP addresses hold no whitespace, so
a finished word can never grow into one. Phone, card, SSN and IBAN numbers do span
words, but only words shaped like their groups: ones with a digit, ones without letters
("(", "+"), groups of up to five letters and digits ("WEST" in an IBAN), and an
extension's "ext". Such an entity starts at a word with a digit, a word without letters,
or a two-letter country code before its check digits. So the end to keep is the trailing
run of group-shaped words from its first possible start, plus the words before it that
presidio reads as context: a context word ("call", "ssn") raises a weak match such as ten
bare digits over the score threshold, and a version word ("version 10.2.0.1") turns a
dotted quad into no IP address. Presidio reads five words before an entity, stop words
not counted.

This holds for the screenable entities only (`SCREENABLE_ENTITIES`); names and places, or
a policy's own patterns, can take any word, so they keep the stream's fixed window.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from presidio_analyzer import EntityRecognizer, Pattern, PatternRecognizer
from presidio_analyzer.predefined_recognizers import PhoneRecognizer
from spacy.lang.en.stop_words import STOP_WORDS

from guardrails.pii_recognizers import VERSION_WORDS

# Presidio's context enhancer reads this many words before an entity (stop words and
# punctuation not counted); one more covers an entity glued to its context word.
CONTEXT_WORDS_BEFORE = 6
_WORD = re.compile(r"\S+")
_LETTER = re.compile(r"[^\W\d_]")
_DIGIT = re.compile(r"\d")
_GROUP_MAX_CHARS = 5


def deciding_context_words(
    recognizers: Sequence[EntityRecognizer], threshold: float
) -> tuple[str, ...]:
    """The context words of the recognizers whose findings may need one to reach
    `threshold` (bare digits near "call", "ssn"). A pattern that validates its match (a
    card's checksum, an e-mail's domain) scores 1.0 or is dropped, whatever surrounds it."""
    words: set[str] = set()
    for recognizer in recognizers:
        if isinstance(recognizer, PatternRecognizer):
            validates = type(recognizer).validate_result is not PatternRecognizer.validate_result
            patterns: list[Pattern] = recognizer.patterns  # type: ignore[has-type]
            weakest = min((p.score for p in patterns), default=1.0)
            if validates or weakest >= threshold:
                continue
        elif isinstance(recognizer, PhoneRecognizer) and threshold <= recognizer.SCORE:
            continue
        words |= {w.lower() for w in recognizer.context or ()}
    return tuple(sorted(words))


def pii_hold_from(text: str, context_words: Sequence[str]) -> int:
    """The position in `text` (which ends after whitespace) from which the PII check may
    still need the text: an entity in progress, or context for one that may follow.
    `len(text)` when it needs none of it."""
    words = [(m.start(), m.group()) for m in _WORD.finditer(text)]
    hold = len(text)
    first_of_run = len(words)
    while first_of_run > 0 and _continues_an_entity(words[first_of_run - 1][1]):
        first_of_run -= 1
    for i in range(first_of_run, len(words)):
        if _may_start_an_entity(words, i):
            hold = words[i][0]
            break
    before = next((i for i, (start, _) in enumerate(words) if start >= hold), len(words))
    context = _context_start(words[:before], context_words)
    return hold if context is None else context


def _number_shaped(word: str) -> bool:
    """A word with a digit, or with no letter ("(", "+", "-")."""
    return bool(_DIGIT.search(word)) or not _LETTER.search(word)


def _continues_an_entity(word: str) -> bool:
    if _number_shaped(word):
        return True
    return (word.isalnum() and len(word) <= _GROUP_MAX_CHARS) or word.lower().startswith("ext")


def _may_start_an_entity(words: list[tuple[int, str]], i: int) -> bool:
    word = words[i][1]
    if _number_shaped(word):
        return True
    # An IBAN's country code written apart from its check digits ("GB 82 WEST ...").
    last = i + 1 == len(words)
    return len(word) == 2 and word.isalpha() and (last or bool(_DIGIT.search(words[i + 1][1])))


def _context_start(words: list[tuple[int, str]], context_words: Sequence[str]) -> int | None:
    """Where the earliest context word among the last words presidio would read starts
    (None: there is none)."""
    counted, earliest = 0, None
    for start, word in reversed(words):
        bare = word.strip(".,;:!?()[]{}\"'").lower()
        if bare in VERSION_WORDS or any(c in bare for c in context_words):
            earliest = start
        if bare and bare not in STOP_WORDS:
            counted += 1
            if counted >= CONTEXT_WORDS_BEFORE:
                break
    return earliest

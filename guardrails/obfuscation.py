"""Generated obfuscations of attacks, for training and measuring the injection check.

Attackers rewrite a known attack so that neither a pattern nor a classifier trained on
clean text recognises it: digits and symbols for letters with letters dropped or swapped
("ign0r all prev instrctns"), letters spaced or dotted out, look-alike letters from other
scripts, text written backwards. `obfuscated_attacks` applies one such style (or two
together) to each of a split's attacks, seeded, so the training split's attacks yield the
training source and the test split's the test source, and no test attack leaks into
training.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence

from guardrails.normalize import CONFUSABLES

# Several readings per letter, as attackers mix them; "1" stands for both "i" and "l".
_LEET_CHOICES: dict[str, str] = {
    "a": "4@",
    "b": "8",
    "e": "3",
    "g": "9",
    "i": "1!",
    "l": "1|",
    "o": "0",
    "s": "5$",
    "t": "7",
}
# One look-alike per Latin letter (the first Cyrillic or Greek one listed).
_LOOKALIKE: dict[str, str] = {latin: chars[0] for latin, chars in CONFUSABLES.items()}
_WORD = re.compile(r"[A-Za-z]+")
_VOWELS = frozenset("aeiou")


def lossy_leet(text: str, rng: random.Random) -> str:
    """Leet digits and symbols in most longer words, some inner vowels dropped and some
    neighbouring letters swapped: the changes no exact reading undoes."""

    def word(match: re.Match[str]) -> str:
        letters = list(match.group())
        if len(letters) < 4 or rng.random() < 0.25:
            return match.group()
        if rng.random() < 0.3:
            inner = [i for i in range(1, len(letters) - 1) if letters[i].lower() in _VOWELS]
            if inner:
                del letters[rng.choice(inner)]
        if rng.random() < 0.2 and len(letters) > 3:
            i = rng.randrange(1, len(letters) - 2)
            letters[i], letters[i + 1] = letters[i + 1], letters[i]
        return "".join(
            rng.choice(_LEET_CHOICES[ch.lower()])
            if ch.lower() in _LEET_CHOICES and rng.random() < 0.55
            else ch
            for ch in letters
        )

    return _WORD.sub(word, text)


def spaced_letters(text: str, rng: random.Random) -> str:
    """The longest words (the ones that carry the attack) spelled out letter by letter,
    with one separator per text: space, dot, dash or underscore."""
    separator = rng.choice(" .-_")
    # Ties broken by the word itself: set order changes with the hash seed.
    words = sorted(
        {m.group() for m in _WORD.finditer(text) if len(m.group()) >= 5}, key=lambda w: (len(w), w)
    )
    chosen = set(words[-rng.randint(2, 4) :])
    return _WORD.sub(
        lambda m: separator.join(m.group()) if m.group() in chosen else m.group(), text
    )


def mixed_scripts(text: str, rng: random.Random) -> str:
    """About half the letters that have a Cyrillic or Greek look-alike replaced by it."""
    return "".join(_LOOKALIKE[ch] if ch in _LOOKALIKE and rng.random() < 0.5 else ch for ch in text)


def reversed_text(text: str, rng: random.Random) -> str:
    """The whole text backwards, or each word backwards in place."""
    if rng.random() < 0.5:
        return text[::-1]
    return " ".join(word[::-1] for word in text.split(" "))


def leet_and_spaced(text: str, rng: random.Random) -> str:
    return spaced_letters(lossy_leet(text, rng), rng)


STYLES: dict[str, Callable[[str, random.Random], str]] = {
    "lossy-leet": lossy_leet,
    "spaced": spaced_letters,
    "mixed-scripts": mixed_scripts,
    "reversed": reversed_text,
    "leet+spaced": leet_and_spaced,
}


def obfuscated_attacks(
    attacks: Sequence[str], count: int, seed: int, max_chars: int = 400
) -> list[tuple[str, str]]:
    """`count` (style, obfuscated text) pairs, styles in turn, each from an attack of at
    most `max_chars` characters (longer ones are rarely rewritten by hand, and the first
    window is what the classifier reads)."""
    rng = random.Random(seed)
    short = sorted({a for a in attacks if len(a) <= max_chars})
    names = list(STYLES)
    pairs: list[tuple[str, str]] = []
    while len(pairs) < count and short:
        style = names[len(pairs) % len(names)]
        text = STYLES[style](rng.choice(short), rng)
        pairs.append((style, text))
    return pairs

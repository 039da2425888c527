"""The verdict every guardrail check returns, and that the audit record keeps."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

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
        data = asdict(self)
        data["evidence"] = list(self.evidence)
        return data

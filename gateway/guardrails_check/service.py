"""The one code path behind the check endpoint and the CLI: the policy's input or output
guardrails, called exactly as the chat path calls them, reported check by check."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.guardrails_check.schemas import (
    CheckedMessage,
    CheckVerdict,
    Decision,
    GuardrailsCheckRequest,
    GuardrailsCheckResponse,
    Span,
)
from gateway.http.errors import ApiError
from gateway.policy.runtime import PolicyRuntime
from guardrails.injection import CHECK_NAME as INJECTION
from guardrails.leaks import CHECK_NAME as LEAK
from guardrails.pii import CHECK_NAME as PII
from guardrails.secrets import CHECK_NAME as SECRETS
from guardrails.topics import CHECK_NAME as TOPIC
from guardrails.verdict import Verdict

CHECK_EVENT = "guardrails.check"
# All texts of one request together; a chat prompt this long would not fit the context.
MAX_TEXT_CHARS = 100_000
CHECKS = {"input": (INJECTION, PII, TOPIC), "output": (LEAK, SECRETS, PII)}
# An injection pattern's evidence: "<pattern> in <where>: <matched text>".
_PATTERN_EVIDENCE = re.compile(r"^(?P<reason>\S+ in [^:]+): (?P<snippet>.+)$", re.DOTALL)
_PLACEHOLDER = re.compile(r"<[A-Z][A-Z0-9_]*_\d+>")


@dataclass(frozen=True, slots=True)
class CheckOutcome:
    """The response, and every verdict as reported (matched text removed) for the audit."""

    response: GuardrailsCheckResponse
    audited: list[Verdict]


def validate_request(request: GuardrailsCheckRequest) -> None:
    """Refuse unknown check names and texts over the size limit, before anything runs."""
    if request.checks is not None:
        known = CHECKS[request.direction]
        unknown = sorted(set(request.checks) - set(known))
        if unknown:
            raise ApiError(
                400,
                f"Unknown {request.direction} checks: {', '.join(unknown)}. "
                f"Known: {', '.join(known)}.",
                param="checks",
                code="unknown_check",
            )
    size = sum(len(t) for t in _texts(request))
    if size > MAX_TEXT_CHARS:
        raise ApiError(
            413,
            f"The text is {size} characters; the check endpoint takes at most {MAX_TEXT_CHARS}.",
            param="messages" if request.messages is not None else "text",
            code="text_too_long",
        )


def run_check(runtime: PolicyRuntime, request: GuardrailsCheckRequest) -> CheckOutcome:
    """Run the direction's guardrails of `runtime` on the request, as the chat path does
    (`ChatService._screen_input` for input, `ChatService.finish` for output)."""
    validate_request(request)
    texts = _texts(request)
    timings: dict[str, float] = {}
    if request.direction == "input":
        roles = [m.role for m in request.messages] if request.messages else ["user"]
        last_user = next(
            (t for t, r in zip(reversed(texts), reversed(roles), strict=True) if r == "user"), ""
        )
        checked = runtime.input_guardrails.check(texts, last_user, roles, timings=timings)
        verdicts, blocked = checked.verdicts, checked.blocking is not None
        out_texts, placeholders = checked.texts, checked.placeholders
    else:
        known: dict[str, str] = {}
        result = runtime.output.filter(texts[0], {}, known, timings=timings)
        verdicts, blocked = result.verdicts, any(v.blocks for v in result.verdicts)
        out_texts, placeholders = [result.text], known
        if any(v.check != PII and v.action == "redact" for v in verdicts):
            placeholders = {}  # offsets would be into the text the earlier checks changed
    pii_spans = _placeholder_spans(out_texts, placeholders)
    decision: Decision = "block" if blocked else "redact" if out_texts != texts else "allow"
    wanted = set(request.checks or CHECKS[request.direction])
    reported = [_report(v, texts, pii_spans, timings.get(v.check, 0.0)) for v in verdicts]
    loaded = runtime.loaded
    response = GuardrailsCheckResponse(
        policy=loaded.policy.name,
        policy_version=loaded.version,
        direction=request.direction,
        decision=decision,
        verdicts=[v for v in reported if v.check in wanted],
        text=None if blocked or request.messages is not None else out_texts[0],
        messages=None
        if blocked or request.messages is None
        else [
            CheckedMessage(role=m.role, content=t)
            for m, t in zip(request.messages, out_texts, strict=True)
        ],
    )
    audited = [Verdict(v.check, v.action, v.score, tuple(v.evidence), v.mode) for v in reported]
    return CheckOutcome(response, audited)


def _texts(request: GuardrailsCheckRequest) -> list[str]:
    if request.messages is not None:
        return [m.text for m in request.messages]
    return [request.text or ""]


def _report(
    verdict: Verdict, texts: Sequence[str], pii_spans: list[Span], latency_ms: float
) -> CheckVerdict:
    """A verdict without raw text: a pattern's matched snippet becomes its offsets."""
    evidence: list[str] = []
    spans: list[Span] = []
    for item in verdict.evidence:
        match = _PATTERN_EVIDENCE.match(item) if verdict.check == INJECTION else None
        if match is None:
            evidence.append(item)
            continue
        evidence.append(match["reason"])
        spans += _find(texts, match["snippet"])
    if verdict.check == PII:
        spans = pii_spans
    return CheckVerdict(
        check=verdict.check,
        action=verdict.action,
        mode=verdict.mode,
        score=verdict.score,
        evidence=evidence,
        spans=spans,
        latency_ms=round(latency_ms, 3),
    )


def _find(texts: Sequence[str], snippet: str) -> list[Span]:
    """Where a matched snippet occurs in the texts as sent (case-insensitively); a match
    in a decoded or joined variant may occur in none of them."""
    needle = snippet.casefold()
    for i, text in enumerate(texts):
        start = text.casefold().find(needle)
        if start >= 0 and len(text.casefold()) == len(text):
            return [Span(message=i, start=start, end=start + len(snippet))]
    return []


def _placeholder_spans(redacted: Sequence[str], placeholders: dict[str, str]) -> list[Span]:
    """The offsets, in the original texts, of the values the PII placeholders replaced:
    each placeholder in a redacted text stands where its value stood."""
    spans: list[Span] = []
    for i, text in enumerate(redacted):
        shift = 0
        for match in _PLACEHOLDER.finditer(text):
            value = placeholders.get(match.group())
            if value is None:
                continue
            start = match.start() - shift
            spans.append(Span(message=i, start=start, end=start + len(value)))
            shift += len(match.group()) - len(value)
    return spans

"""Credentials in model output: API keys, tokens, private keys, connection-string passwords.

Each match is replaced by a typed marker such as `<SECRET:aws_access_key>`. Where only
part of a match is secret (the password in `postgres://app:hunter2@db`), only that group
is replaced, so the answer stays readable.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from guardrails.config import SecretsConfig
from guardrails.verdict import Action, Filtered, Verdict, run_output_filter

CHECK_NAME = "secrets"


@dataclass(frozen=True, slots=True)
class SecretPattern:
    """A named regex; with `group` set, only that group is the secret."""

    name: str
    regex: re.Pattern[str]
    group: int = 0


# The key words whose value is a secret: written once, for the patterns and for what a
# stream must hold while the value is still to come.
_AWS_SECRET_WORD = r"aws_?secret_?(?:access_?)?key"
_PASSWORD_WORDS = r"password|passwd|pwd|secret|api[_-]?key|access[_-]?token|auth[_-]?token"


def _p(name: str, regex: str, group: int = 0, flags: int = 0) -> SecretPattern:
    return SecretPattern(name, re.compile(regex, flags), group)


BUILTIN_SECRETS: tuple[SecretPattern, ...] = (
    # A whole block, or from BEGIN to the end of the text while the END line is still
    # being streamed; body lines released before the header are caught by key_material.
    _p(
        "private_key",
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
        r"(?:.*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|.*\Z)",
        flags=re.DOTALL,
    ),
    _p("key_material", r"^[A-Za-z0-9+/]{60,}={0,2}$", flags=re.MULTILINE),
    _p("openai_key", r"\bsk-(?:proj-|svcacct-|admin-|ant-)?[A-Za-z0-9_-]{20,}"),
    _p("aws_access_key", r"\b(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}\b"),
    _p(
        "aws_secret_key",
        _AWS_SECRET_WORD + r"\W{0,4}[:=]\s*[\"']?([A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])",
        group=1,
        flags=re.IGNORECASE,
    ),
    _p("github_token", r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})"),
    _p("gitlab_token", r"\bglpat-[A-Za-z0-9_-]{20,}"),
    _p("slack_token", r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
    _p("google_api_key", r"\bAIza[0-9A-Za-z_-]{35}"),
    _p("stripe_key", r"\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}"),
    _p("jwt", r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    _p(
        "connection_string_password",
        r"\b[a-z][a-z0-9+.-]*://[^\s:/@]+:([^\s@/]+)@",
        group=1,
        flags=re.IGNORECASE,
    ),
    _p(
        "password_assignment",
        rf"\b(?:{_PASSWORD_WORDS})[\"']?\s*[:=]\s*[\"']?([^\s\"',;<>]{{6,}})",
        group=1,
        flags=re.IGNORECASE,
    ),
)


# Of the built-in patterns, only these match across whitespace: a private key block from
# its BEGIN line, and a key word whose value follows after ":" or "=" and spaces. Every
# other one is a single word, which a stream holds until it ends.
_BLOCK_BEGIN = "-----BEGIN"
_BLOCK_END = re.compile(r"-----END [A-Z0-9 ]*-----")
_ASSIGNMENT_IN_PROGRESS = re.compile(
    rf"(?:{_PASSWORD_WORDS}|{_AWS_SECRET_WORD})\W*$", re.IGNORECASE
)
# How far back an assignment's key word can lie from the end with no value yet.
_ASSIGNMENT_REACH = 64


class SecretsFilter:
    """Finds and (in enforce mode) masks secrets in a text."""

    def __init__(self, config: SecretsConfig) -> None:
        self._config = config
        extra = [_p(f"extra_{i}", rx) for i, rx in enumerate(config.extra_patterns)]
        self._patterns = [*BUILTIN_SECRETS, *extra]

    @property
    def config(self) -> SecretsConfig:
        return self._config

    def hold_from(self, text: str) -> int | None:
        """Where the end of a streamed answer may still be the start of a secret: an open
        private key block, or a key word still waiting for its value (`len(text)` when
        neither). None with a policy's own patterns, which may span words."""
        if self._config.extra_patterns:
            return None
        hold = len(text)
        begin = text.rfind(_BLOCK_BEGIN)
        if begin >= 0 and not _BLOCK_END.search(text, begin):
            hold = begin
        tail_start = max(len(text) - _ASSIGNMENT_REACH, 0)
        if assignment := _ASSIGNMENT_IN_PROGRESS.search(text, tail_start):
            hold = min(hold, assignment.start())
        return hold

    def filter(self, text: str) -> Filtered:
        return run_output_filter(CHECK_NAME, self._config, text, self._filter)

    def _filter(self, text: str) -> Filtered:
        mode = self._config.mode
        spans: list[tuple[int, int, str]] = []
        for pattern in self._patterns:
            for match in pattern.regex.finditer(text):
                start, end = match.span(pattern.group)
                if start < end and all(end <= s or start >= e for s, e, _ in spans):
                    spans.append((start, end, pattern.name))
        if not spans:
            return Filtered(text, Verdict(CHECK_NAME, "allow", 0.0, (), mode))
        spans.sort()
        names = sorted({name for _, _, name in spans})
        evidence = tuple(f"{name} x{sum(1 for *_, n in spans if n == name)}" for name in names)
        action: Action = "redact" if mode == "enforce" else "flag"
        verdict = Verdict(CHECK_NAME, action, 1.0, evidence, mode)
        if mode != "enforce":
            return Filtered(text, verdict)
        parts, cursor = [], 0
        for start, end, name in spans:
            parts += [text[cursor:start], f"<SECRET:{name}>"]
            cursor = end
        parts.append(text[cursor:])
        return Filtered("".join(parts), verdict)

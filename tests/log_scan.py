"""A pytest plugin: the logs of the whole test run must hold no email, phone number or key.

Every test's captured stderr and log records are scanned as the test finishes; the run
fails at the end if any of them shows an email address, a phone number or a Bastion API
key. The server under test logs into the same captures, so a leak in any request path
that a test exercises is caught here, not only in the dedicated log-hygiene test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

PATTERNS = {
    "email address": re.compile(
        r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[a-z]{2,}\b"
    ),
    "phone number": re.compile(r"(?<![\d.:-])\(?\d{3}\)?[-. ]\d{3}[-. ]\d{4}(?![\d-])"),
    "API key": re.compile(r"\bbst_[A-Za-z0-9_-]{20,}"),
}
SCANNED_SECTIONS = ("Captured stderr", "Captured log")


@dataclass(frozen=True)
class Finding:
    test: str
    kind: str
    line: str


def findings_in(test: str, text: str) -> list[Finding]:
    found = []
    for line in text.splitlines():
        for kind, pattern in PATTERNS.items():
            if pattern.search(line):
                found.append(Finding(test, kind, line.strip()[:200]))
    return found


class LogScanner:
    """Registered by tests/conftest.py; collects findings and fails the run on any."""

    def __init__(self) -> None:
        self.findings: dict[Finding, None] = {}  # ordered, without repeats
        self.scanned_chars = 0

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for title, text in report.sections:
            if title.startswith(SCANNED_SECTIONS):
                self.scanned_chars += len(text)
                self.findings.update(dict.fromkeys(findings_in(report.nodeid, text)))

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.findings and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.findings:
            terminalreporter.write_line(
                f"log scan: no email, phone number or API key in "
                f"{self.scanned_chars:,} characters of captured logs"
            )
            return
        terminalreporter.section("log scan: sensitive values in the test run's logs", red=True)
        for finding in list(self.findings)[:50]:
            terminalreporter.write_line(f"{finding.test}: {finding.kind}: {finding.line}")

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from presidio_analyzer import AnalyzerEngine

from guardrails.config import PiiConfig
from guardrails.pii import PiiRedactor, build_analyzer

TEXT = "Write to john.doe@example.com or call 555 123 4567 today."


def test_email_and_phone_are_replaced_by_numbered_placeholders(redactor: PiiRedactor) -> None:
    result = redactor.redact(TEXT)
    assert result.text == "Write to <EMAIL_ADDRESS_1> or call <PHONE_NUMBER_1> today."
    assert result.placeholders == {
        "<EMAIL_ADDRESS_1>": "john.doe@example.com",
        "<PHONE_NUMBER_1>": "555 123 4567",
    }
    assert [f.entity_type for f in result.findings] == ["EMAIL_ADDRESS", "PHONE_NUMBER"]


def test_same_value_gets_same_placeholder(redactor: PiiRedactor) -> None:
    result = redactor.redact("a@example.com, b@example.org, again a@example.com")
    assert result.text == "<EMAIL_ADDRESS_1>, <EMAIL_ADDRESS_2>, again <EMAIL_ADDRESS_1>"


def test_card_ssn_iban_ip_are_redacted(redactor: PiiRedactor) -> None:
    text = (
        "card 4111 1111 1111 1111, ssn 536-22-1234, iban GB82 WEST 1234 5698 7654 32, host 10.0.0.1"
    )
    redacted = redactor.redact(text).text
    for original in ("4111 1111 1111 1111", "536-22-1234", "GB82 WEST", "10.0.0.1"):
        assert original not in redacted
    for placeholder in ("<CREDIT_CARD_1>", "<US_SSN_1>", "<IBAN_CODE_1>", "<IP_ADDRESS_1>"):
        assert placeholder in redacted


def test_check_shares_numbering_across_texts(redactor: PiiRedactor) -> None:
    texts, verdict = redactor.check(["mail a@example.com", "or b@example.org or a@example.com"])
    assert texts == ["mail <EMAIL_ADDRESS_1>", "or <EMAIL_ADDRESS_2> or <EMAIL_ADDRESS_1>"]
    assert verdict.action == "redact"
    assert verdict.check == "pii"
    assert verdict.evidence == ("EMAIL_ADDRESS x3",)
    assert verdict.score == 1.0


def test_clean_text_is_allowed(redactor: PiiRedactor) -> None:
    texts, verdict = redactor.check(["What is our refund policy for annual plans?"])
    assert texts == ["What is our refund policy for annual plans?"]
    assert verdict.action == "allow"


def test_names_are_not_redacted_with_default_entities(redactor: PiiRedactor) -> None:
    # PERSON is not in the default entity list.
    assert redactor.redact("John Smith lives in Paris").text == "John Smith lives in Paris"


def test_warn_mode_keeps_text_and_flags(analyzer: AnalyzerEngine) -> None:
    texts, verdict = PiiRedactor(analyzer, PiiConfig(mode="warn")).check([TEXT])
    assert texts == [TEXT]
    assert verdict.action == "flag"
    assert verdict.mode == "warn"


def test_disabled_keeps_text(analyzer: AnalyzerEngine) -> None:
    texts, verdict = PiiRedactor(analyzer, PiiConfig(enabled=False)).check([TEXT])
    assert texts == [TEXT]
    assert verdict.action == "allow"


def test_entities_config_limits_what_is_redacted(analyzer: AnalyzerEngine) -> None:
    only_email = PiiRedactor(analyzer, PiiConfig(entities=["EMAIL_ADDRESS"]))
    assert only_email.redact(TEXT).text == "Write to <EMAIL_ADDRESS_1> or call 555 123 4567 today."


def test_no_uk_nhs_recognizer(analyzer: AnalyzerEngine) -> None:
    names = {type(r).__name__ for r in analyzer.registry.recognizers}
    assert "NhsRecognizer" not in names
    assert "EmailRecognizer" in names


def test_build_analyzer_is_cached() -> None:
    assert build_analyzer() is build_analyzer()


def test_build_and_analyze_without_network(tmp_path: Path) -> None:
    """A fresh interpreter with sockets disabled and an empty tldextract cache builds the
    analyzer and redacts an email without a single connection or DNS attempt."""
    script = textwrap.dedent(
        """
        import socket

        attempts = []

        def refuse(*args, **kwargs):
            attempts.append(repr(args[:2]))
            raise OSError("network access attempted")

        class NoConnectSocket(socket.socket):
            connect = refuse
            connect_ex = refuse

        socket.socket = NoConnectSocket
        socket.getaddrinfo = refuse

        from guardrails.config import PiiConfig
        from guardrails.pii import PiiRedactor, build_analyzer

        redactor = PiiRedactor(build_analyzer(), PiiConfig())
        print(redactor.redact("mail john.doe@example.com now").text)
        print("attempts:", attempts)
        """
    )
    env = {**os.environ, "TLDEXTRACT_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[-2] == "mail <EMAIL_ADDRESS_1> now"
    assert lines[-1] == "attempts: []"

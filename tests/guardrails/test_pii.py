from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from presidio_analyzer import AnalyzerEngine

from guardrails.config import CustomRecognizer, PiiConfig
from guardrails.pii import PiiConfigError, PiiRedactor, build_analyzer, phone_regions, restore
from guardrails.verdict import CheckMode

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
    assert verdict.evidence == ("EMAIL_ADDRESS x3: redact",)
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


def test_uk_nhs_numbers_are_not_looked_for_by_default(redactor: PiiRedactor) -> None:
    # NHS numbers fire on ten-digit US phone numbers; uk is a default country for its
    # phone formats, and UK_NHS stays out of the default entities.
    assert "UK_NHS" not in PiiConfig().entities
    findings = redactor.analyze("Call me at 943 476 5919 tonight.")
    assert [f.entity_type for f in findings] == ["PHONE_NUMBER"]


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


def test_block_action_blocks_and_names_the_entity(analyzer: AnalyzerEngine) -> None:
    config = PiiConfig(actions={"US_SSN": "block"})
    check = PiiRedactor(analyzer, config).check_detailed(["my ssn is 536-22-1234, mail a@b.com"])
    assert check.verdict.action == "block"
    assert check.verdict.blocks
    assert "US_SSN x1: block" in check.verdict.evidence
    assert "536-22-1234" not in " ".join(check.verdict.evidence)


def test_allow_action_leaves_the_value(analyzer: AnalyzerEngine) -> None:
    config = PiiConfig(actions={"EMAIL_ADDRESS": "allow"})
    texts, verdict = PiiRedactor(analyzer, config).check(["write to a@example.com"])
    assert texts == ["write to a@example.com"]
    assert verdict.action == "allow"
    assert verdict.evidence == ("EMAIL_ADDRESS x1: allow",)


def test_pseudonymized_values_are_restorable_redacted_ones_are_not(
    analyzer: AnalyzerEngine,
) -> None:
    config = PiiConfig(actions={"EMAIL_ADDRESS": "pseudonymize"})
    check = PiiRedactor(analyzer, config).check_detailed(
        ["mail a@example.com about card 4111 1111 1111 1111"]
    )
    assert check.texts == ["mail <EMAIL_ADDRESS_1> about card <CREDIT_CARD_1>"]
    assert check.restorable == {"<EMAIL_ADDRESS_1>": "a@example.com"}
    answer = "I wrote to <EMAIL_ADDRESS_1> about <CREDIT_CARD_1>."
    assert restore(answer, check.restorable) == "I wrote to a@example.com about <CREDIT_CARD_1>."


def test_custom_recognizer_with_context(analyzer: AnalyzerEngine) -> None:
    employee = CustomRecognizer(
        entity="EMPLOYEE_ID", patterns=[r"\bE-\d{6}\b"], context=["employee"], score=0.3
    )
    redactor = PiiRedactor(analyzer, PiiConfig(custom_recognizers=[employee]))
    assert redactor.redact("employee number E-123456 asked").text == (
        "employee number <EMPLOYEE_ID_1> asked"
    )
    # Below the 0.4 threshold without a context word nearby.
    assert redactor.redact("part E-123456 is in stock").text == "part E-123456 is in stock"


def test_invalid_custom_recognizer_is_rejected() -> None:
    with pytest.raises(ValueError, match="UPPER_SNAKE_CASE"):
        CustomRecognizer(entity="employee id", patterns=[r"\d+"])
    with pytest.raises(ValueError, match="not a valid regex"):
        CustomRecognizer(entity="EMPLOYEE_ID", patterns=["(unclosed"])


def test_countries_select_country_recognizers() -> None:
    uk = build_analyzer(["uk"])
    config = PiiConfig(entities=["UK_NHS"], countries=["uk"])
    assert PiiRedactor(uk, config).analyze("NHS number 943 476 5919")
    with pytest.raises(PiiConfigError, match="UK_NHS"):
        PiiRedactor(build_analyzer(["us"]), config)


def test_uk_national_phone_numbers_are_read_by_default(redactor: PiiRedactor) -> None:
    assert PiiConfig().countries == ["us", "uk"]
    assert redactor.redact("Call 020 7946 0958.").text == "Call <PHONE_NUMBER_1>."


@pytest.mark.parametrize("mode", ["warn", "dryrun"])
def test_non_enforce_modes_do_not_change_text(analyzer: AnalyzerEngine, mode: CheckMode) -> None:
    config = PiiConfig(mode=mode, actions={"US_SSN": "block"})
    texts, verdict = PiiRedactor(analyzer, config).check(["ssn 536-22-1234"])
    assert texts == ["ssn 536-22-1234"]
    assert verdict.action == "block"
    assert not verdict.blocks


def test_error_inside_the_check_fails_closed(analyzer: AnalyzerEngine) -> None:
    redactor = PiiRedactor(analyzer, PiiConfig())
    redactor.analyze = _raise  # type: ignore[method-assign]
    check = redactor.check_detailed(["hello"])
    assert check.verdict.blocks
    assert "check error" in check.verdict.evidence[0]
    open_redactor = PiiRedactor(analyzer, PiiConfig(fail_closed=False))
    open_redactor.analyze = _raise  # type: ignore[method-assign]
    assert open_redactor.check_detailed(["hello"]).verdict.action == "allow"


def _raise(text: str) -> list[object]:
    raise RuntimeError("analyzer exploded")


def test_formats_presidio_misses_are_caught(redactor: PiiRedactor) -> None:
    assert redactor.redact("Card 2223 0031 2200 3222 was declined.").text == (
        "Card <CREDIT_CARD_1> was declined."
    )
    assert redactor.redact("Phone: +1-933-663-3875x004").text == "Phone: <PHONE_NUMBER_1>"
    # A 2-series number failing the Luhn check is not a card.
    assert redactor.redact("Ref 2223 0031 2200 3223").text == "Ref 2223 0031 2200 3223"


def test_phone_numbers_are_read_in_the_national_formats_of_the_policys_countries() -> None:
    london = "Call our London office on 020 7946 0958."

    def phones(countries: list[str], text: str) -> list[str]:
        found = build_analyzer(countries).analyze(text, language="en")
        return [text[r.start : r.end] for r in found if r.entity_type == "PHONE_NUMBER"]

    assert phones(["us"], london) == []
    assert phones(["us", "uk"], london) == ["020 7946 0958"]
    # International and US numbers are found with the default country.
    assert phones(["us"], "Call +44 20 7946 0958 today.") == ["+44 20 7946 0958"]
    assert phones(["us"], "Call me at (555) 201-3344.") == ["(555) 201-3344"]
    assert phone_regions(["uk", "us", "xx"]) == ("GB", "US")


@pytest.mark.parametrize(
    "email",
    [
        "jane.doe@acme.local",
        "ops@build.internal",
        "it-help@hq.corp",
        "bob@mail.example",
        "qa+1@staging.test",
        "admin@router.lan",
        "nas@house.home.arpa",
        "hr@portal.intranet",
        "root@box.localdomain",
    ],
)
def test_email_at_internal_or_reserved_domain_is_redacted(
    redactor: PiiRedactor, email: str
) -> None:
    result = redactor.redact(f"Forward it to {email} today.")
    assert result.text == "Forward it to <EMAIL_ADDRESS_1> today."
    assert result.placeholders == {"<EMAIL_ADDRESS_1>": email}


def test_ordinary_email_is_unchanged_and_a_bare_internal_host_is_no_email(
    redactor: PiiRedactor,
) -> None:
    result = redactor.redact("Mail anna@example.co.uk, not the host build.corp or acme.local.")
    assert result.text == "Mail <EMAIL_ADDRESS_1>, not the host build.corp or acme.local."
    assert [f.entity_type for f in result.findings] == ["EMAIL_ADDRESS"]
    # An unknown suffix that is not a reserved one is still refused, as presidio does.
    assert redactor.redact("see a@b.notatld").text == "see a@b.notatld"


@pytest.mark.parametrize(
    "text",
    [
        "Upgrade to version 10.2.0.1 tonight.",
        "Running v1.2.3.4 in production.",
        "release 2.0.0.1 fixes it",
        "Firmware: 4.1.0.12 is out",
        "build 7.0.0.3 failed",
        "Ver. 3.3.3.3",
    ],
)
def test_version_string_shaped_like_an_ipv4_address_is_kept(
    redactor: PiiRedactor, text: str
) -> None:
    assert redactor.redact(text).text == text


@pytest.mark.parametrize(
    ("text", "redacted"),
    [
        ("Please connect to 10.2.0.1 now.", "Please connect to <IP_ADDRESS_1> now."),
        ("The server at 192.168.1.20 is down.", "The server at <IP_ADDRESS_1> is down."),
        (
            "version 2.0.0.1 runs on 10.0.0.7",
            "version 2.0.0.1 runs on <IP_ADDRESS_1>",
        ),
    ],
)
def test_real_ip_addresses_are_still_redacted(
    redactor: PiiRedactor, text: str, redacted: str
) -> None:
    assert redactor.redact(text).text == redacted

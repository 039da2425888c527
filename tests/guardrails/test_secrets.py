from __future__ import annotations

import pytest

from guardrails.config import SecretsConfig
from guardrails.secrets import SecretsFilter
from guardrails.verdict import CheckMode

SECRETS = {
    "openai_key": "sk-proj-Ab3dEfGh1jKlMnOpQrStUvWx",
    "aws_access_key": "AKIAIOSFODNN7EXAMPLE",
    "github_token": "ghp_" + "a1B2" * 9,
    "slack_token": "xoxb-1234567890-abcdefghij",
    "google_api_key": "AIza" + "B" * 35,
    "stripe_key": "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N",
}


@pytest.fixture(scope="module")
def secrets() -> SecretsFilter:
    return SecretsFilter(SecretsConfig())


@pytest.mark.parametrize("name", sorted(SECRETS))
def test_builtin_secrets_are_masked(secrets: SecretsFilter, name: str) -> None:
    result = secrets.filter(f"Here it is: {SECRETS[name]} -- keep it safe.")
    assert SECRETS[name] not in result.text
    assert f"<SECRET:{name}>" in result.text
    assert result.verdict.action == "redact"
    assert result.verdict.evidence == (f"{name} x1",)


def test_only_the_password_of_a_connection_string_is_masked(secrets: SecretsFilter) -> None:
    result = secrets.filter("use postgres://app:hunter22@db.internal:5432/main")
    assert (
        result.text
        == "use postgres://app:<SECRET:connection_string_password>@db.internal:5432/main"
    )


def test_private_key_block_and_unterminated_block(secrets: SecretsFilter) -> None:
    key = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY-----"
    assert secrets.filter(f"key:\n{key}\nthanks").text == "key:\n<SECRET:private_key>\nthanks"
    assert secrets.filter("-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBg").text == (
        "<SECRET:private_key>"
    )


def test_aws_secret_key_and_password_assignment(secrets: SecretsFilter) -> None:
    text = "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\npassword: Tr0ub4dor&3"
    result = secrets.filter(text)
    assert "wJalrXUtnFEMI" not in result.text
    assert "Tr0ub4dor" not in result.text


@pytest.mark.parametrize(
    "text",
    [
        "Our password policy requires twelve characters.",
        "Use the sk- prefix for keys, e.g. sk-...",
        "See https://example.com/docs for the API key setup.",
        "The task list has 12 items.",
    ],
)
def test_ordinary_text_passes(secrets: SecretsFilter, text: str) -> None:
    result = secrets.filter(text)
    assert result.text == text
    assert result.verdict.action == "allow"


def test_extra_patterns() -> None:
    secrets = SecretsFilter(SecretsConfig(extra_patterns=[r"\bNW-[0-9A-F]{12}\b"]))
    assert secrets.filter("token NW-0123456789AB").text == "token <SECRET:extra_0>"


@pytest.mark.parametrize("mode", ["warn", "dryrun"])
def test_non_enforce_modes_keep_text(mode: CheckMode) -> None:
    result = SecretsFilter(SecretsConfig(mode=mode)).filter(SECRETS["aws_access_key"])
    assert result.text == SECRETS["aws_access_key"]
    assert result.verdict.action == "flag"
    assert not result.verdict.blocks


def test_error_fails_closed(secrets: SecretsFilter, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(text: str) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(secrets, "_filter", boom)
    result = secrets.filter("anything")
    assert result.verdict.blocks
    assert "anything" not in result.text


@pytest.mark.parametrize(
    ("text", "held"),
    [
        ("Use these settings. ", ""),
        ("The key is -----BEGIN RSA PRIVATE ", "-----BEGIN RSA PRIVATE "),
        (
            "-----BEGIN RSA PRIVATE KEY----- MIIE -----END ",
            "-----BEGIN RSA PRIVATE KEY----- MIIE -----END ",
        ),
        ("-----BEGIN RSA PRIVATE KEY----- MIIE -----END RSA PRIVATE KEY----- Done. ", ""),
        ("Log in with password: ", "password: "),
        ("Set AWS_SECRET_ACCESS_KEY = ", "AWS_SECRET_ACCESS_KEY = "),
        ("The password was changed yesterday. ", ""),
    ],
)
def test_a_stream_holds_a_secret_still_being_written(
    secrets: SecretsFilter, text: str, held: str
) -> None:
    hold = secrets.hold_from(text)
    assert hold is not None and text[hold:] == held


def test_a_policys_own_patterns_leave_the_stream_to_its_window() -> None:
    extra = SecretsFilter(SecretsConfig(extra_patterns=[r"internal token \w+"]))
    assert extra.hold_from("Use these settings. ") is None

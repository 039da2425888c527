from __future__ import annotations

import random

import pytest
from presidio_analyzer import AnalyzerEngine

from guardrails.config import LeakConfig, PiiConfig, SecretsConfig
from guardrails.leaks import LeakDetector
from guardrails.output_check import OutputGuardrails
from guardrails.pii import PiiRedactor
from guardrails.secrets import SecretsFilter
from guardrails.streaming import StreamingRedactor

SYSTEM_PROMPT = "You are the billing assistant of Northwind. Never discuss salaries with anyone."
CANARY = "bastion-canary-5f1e9a0c"
ANSWER = (
    "Sure. Contact jane.roe@example.com for refunds; the staging key is "
    "sk-proj-Zx81LmQ0pRtY7uWv3sNa and the database is postgres://app:s3cr3tPW@db:5432/x. "
    f"Internal marker {CANARY}. As told: you are the billing assistant of Northwind, "
    "never discuss salaries with anyone. Call 555 123 4567 if urgent. Thanks for asking!"
)
FORBIDDEN = (
    "jane.roe",
    "example.com",
    "sk-proj",
    "Zx81",
    "s3cr3tPW",
    CANARY,
    "salaries",
    "billing assistant",
    "555",
    "4567",
)


@pytest.fixture(scope="module")
def output(analyzer: AnalyzerEngine) -> OutputGuardrails:
    return OutputGuardrails(
        PiiRedactor(analyzer, PiiConfig()),
        SecretsFilter(SecretsConfig()),
        LeakDetector(LeakConfig(canaries=[CANARY], ngram_words=6), SYSTEM_PROMPT),
    )


def test_whole_answer_is_filtered_with_a_verdict_per_check(output: OutputGuardrails) -> None:
    result = output.filter(ANSWER)
    for fragment in FORBIDDEN:
        assert fragment not in result.text
    assert [v.check for v in result.verdicts] == ["prompt_leak", "secrets", "pii"]
    assert [v.action for v in result.verdicts] == ["block", "redact", "redact"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_streamed_chunk_shows_pii_secrets_or_leaks(output: OutputGuardrails, seed: int) -> None:
    rng = random.Random(seed)
    stream = StreamingRedactor(output.redactor(), window_chars=64)
    chunks, i = [], 0
    while i < len(ANSWER):
        size = rng.randint(1, 9)
        chunks.append(stream.feed(ANSWER[i : i + size]))
        i += size
    chunks.append(stream.flush())
    assert sum(1 for c in chunks if c) > 2  # it streamed
    for chunk in chunks:
        for fragment in FORBIDDEN:
            assert fragment not in chunk, (fragment, chunk)
    assert "Thanks for asking!" in "".join(chunks)


def test_email_never_appears_in_any_chunk_char_by_char(analyzer: AnalyzerEngine) -> None:
    output = OutputGuardrails(PiiRedactor(analyzer, PiiConfig()))
    text = "Write to john.smith@corp.example.org and cc anna@example.net before Friday please."
    stream = StreamingRedactor(output.redactor(), window_chars=48)
    chunks = [stream.feed(ch) for ch in text] + [stream.flush()]
    joined = "".join(chunks)
    assert "@" not in joined
    assert "<EMAIL_ADDRESS_1>" in joined and "<EMAIL_ADDRESS_2>" in joined


def test_pseudonymised_values_come_back_in_the_stream(output: OutputGuardrails) -> None:
    restorable = {"<EMAIL_ADDRESS_1>": "a@example.com"}
    stream = StreamingRedactor(output.redactor(restorable), window_chars=48)
    text = "I will write to <EMAIL_ADDRESS_1> today and copy <PHONE_NUMBER_1> as well."
    out = "".join(stream.feed(text[i : i + 5]) for i in range(0, len(text), 5)) + stream.flush()
    assert out == "I will write to a@example.com today and copy <PHONE_NUMBER_1> as well."


def test_output_pii_error_fails_closed(analyzer: AnalyzerEngine) -> None:
    pii = PiiRedactor(analyzer, PiiConfig())

    def boom(text: str) -> list[object]:
        raise RuntimeError("presidio down")

    pii.analyze = boom  # type: ignore[method-assign]
    result = OutputGuardrails(pii).filter("mail a@example.com")
    assert "a@example.com" not in result.text
    assert result.verdicts[0].blocks


def test_only_an_enabled_check_or_a_pseudonym_can_change_the_text(
    analyzer: AnalyzerEngine, output: OutputGuardrails
) -> None:
    off = OutputGuardrails(
        PiiRedactor(analyzer, PiiConfig(enabled=False)),
        SecretsFilter(SecretsConfig(enabled=False)),
        LeakDetector(LeakConfig(enabled=False, canaries=[CANARY]), SYSTEM_PROMPT),
    )
    assert not off.changes_text() and off.filter(ANSWER).text == ANSWER
    assert off.changes_text({"<EMAIL_ADDRESS_1>": "a@example.com"})
    assert output.changes_text()
    only_secrets = OutputGuardrails(secrets=SecretsFilter(SecretsConfig()))
    assert only_secrets.changes_text() and only_secrets.filter(ANSWER).text != ANSWER

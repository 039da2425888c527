from __future__ import annotations

import itertools
import re
from collections.abc import Callable

import pytest
from presidio_analyzer import AnalyzerEngine

from guardrails.config import LeakConfig, PiiConfig, SecretsConfig
from guardrails.leaks import LeakDetector
from guardrails.output_check import OutputGuardrails
from guardrails.pii import PiiRedactor
from guardrails.secrets import SecretsFilter
from guardrails.streaming import StreamingRedactor

ANSWER = (
    "Sure! You can reach our support lead at jane.roe@example.com during office hours, "
    "or call her desk at 555 123 4567 if it is urgent. She usually replies within a day."
)


def _session(redactor: PiiRedactor) -> Callable[[str], str]:
    """A redact function with one numbering for the whole answer."""
    numbering: dict[str, int] = {}
    known: dict[str, str] = {}
    return lambda text: redactor.redact(text, numbering, known).text


def test_char_by_char_stream_matches_whole_redaction(redactor: PiiRedactor) -> None:
    stream = StreamingRedactor(_session(redactor), window_chars=48)
    released = [stream.feed(ch) for ch in ANSWER]
    out = "".join(released) + stream.flush()
    assert out == redactor.redact(ANSWER).text
    assert "jane.roe@example.com" not in out
    assert "555 123 4567" not in out
    assert "<EMAIL_ADDRESS_1>" in out and "<PHONE_NUMBER_1>" in out
    # It did stream: something was released before the end.
    assert sum(1 for chunk in released if chunk) > 1


def test_no_released_chunk_holds_part_of_an_entity(redactor: PiiRedactor) -> None:
    stream = StreamingRedactor(_session(redactor), window_chars=48)
    chunks = [stream.feed(ANSWER[i : i + 7]) for i in range(0, len(ANSWER), 7)]
    chunks.append(stream.flush())
    for chunk in chunks:
        for fragment in ("555", "4567", "jane.roe", "example.com"):
            assert fragment not in chunk


def test_window_is_held_back() -> None:
    stream = StreamingRedactor(lambda text: text, window_chars=10)
    assert stream.feed("one two") == ""
    released = stream.feed(" three four five six")
    assert released and released.endswith(" ")
    assert "one two three four five six".startswith(released)
    assert len("one two three four five six") - len(released) >= 10
    assert released + stream.flush() == "one two three four five six"


def test_flush_on_empty_stream() -> None:
    stream = StreamingRedactor(lambda text: text.upper(), window_chars=48)
    assert stream.flush() == ""
    stream.feed("short")
    assert stream.flush() == "SHORT"


# One entity of each kind the output checks must never release in pieces, in a sentence
# long enough that the stream releases text before and after it.
SPLIT_ENTITIES = {
    "email": "jane.roe@example.com",
    "phone": "555 123 4567",
    "iban": "DE89 3704 0044 0532 0130 00",
    "secret": "sk-proj-Zx81LmQ0pRtY7uWv3sNa",
    "password": "password: hunter2secret",
    # Found only with the context word before it.
    "bare phone": "call me on 2125550123",
    "phone extension": "(212) 555-0123 ext. 42",
    "international phone": "+44 20 7946 0958",
    "card": "4111 1111 1111 1111",
    "private key": (
        "-----BEGIN RSA PRIVATE KEY----- MIIEpAIBAAKCAQEA1x3ZbQ -----END RSA PRIVATE KEY-----"
    ),
    # Eight words and more of the system prompt.
    "prompt leak": "answer briefly and truthfully. When sources are given, answer from them",
}
# Kept as they are, but only with the words before them in view.
CONTEXT_KEPT = {"version": "version 10.2.0.1"}
SYSTEM_PROMPT = (
    "You are Northwind's internal assistant. Answer briefly and truthfully. When sources "
    "are given, answer from them and cite them as [1], [2]."
)


def _sentence(entity: str) -> str:
    return (
        "Thanks for waiting, here is what you asked for earlier today. "
        f"The value is {entity} and it is only for you. Please keep it safe and "
        "do not forward it to anyone outside the team."
    )


def _deltas(text: str, split: int) -> list[str]:
    """Tiny deltas of one to three characters, with a boundary at `split`."""
    bounds, i, sizes = {split}, 0, (1, 3, 2)
    while i < len(text):
        bounds.add(i)
        i += sizes[i % 3]
    edges = [*sorted(b for b in bounds if 0 <= b < len(text)), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(edges) if b > a]


@pytest.fixture(scope="module")
def output(redactor: PiiRedactor) -> OutputGuardrails:
    leaks = LeakDetector(LeakConfig(), SYSTEM_PROMPT)
    return OutputGuardrails(redactor, SecretsFilter(SecretsConfig()), leaks)


@pytest.mark.parametrize("held", [False, True], ids=["window", "checks' hold"])
@pytest.mark.parametrize("chunk_chars", [1, 8, 32])
@pytest.mark.parametrize("kind", sorted(SPLIT_ENTITIES.keys() | CONTEXT_KEPT.keys()))
def test_an_entity_split_at_every_point_is_never_released_in_pieces(
    output: OutputGuardrails, kind: str, chunk_chars: int, held: bool
) -> None:
    """Chunk sizes from one (a check at every word's end) up move the checks around the
    entity, so cuts land next to, inside and after it. With the checks' hold, text is
    released as soon as they say no check can still need it, well inside the window."""
    entity = SPLIT_ENTITIES.get(kind) or CONTEXT_KEPT[kind]
    answer = _sentence(entity)
    whole = _unnumbered(output.redactor()(answer))
    assert (entity in whole) == (kind in CONTEXT_KEPT)
    start = answer.index(entity)
    parts = entity.replace(":", " ").replace(",", " ").split()
    fragments = [part for part in parts if len(part) >= 3 and part not in whole]
    for split in range(start, start + len(entity) + 1):
        hold = output.hold_from if held else None
        stream = StreamingRedactor(output.redactor(), 48, chunk_chars, hold=hold)
        released, chunks = "", 0
        for delta in _deltas(answer, split):
            piece = _unnumbered(stream.feed(delta))
            released += piece
            chunks += bool(piece)
            # Whatever went out is the start of the whole-answer redaction: no piece of
            # the entity (the redaction has a placeholder there) was ever visible.
            assert whole.startswith(released), (split, released)
        released += _unnumbered(stream.flush())
        assert released == whole, split
        assert chunks >= 2, split  # it streamed around the entity
        for fragment in fragments:
            assert fragment not in released, (split, fragment)


def _unnumbered(text: str) -> str:
    """Placeholders without their numbers: the window alone may number a phone number
    before its extension comes in, so the whole number gets the next placeholder."""
    return re.sub(r"<([A-Z_]+)_\d+>", r"<\1>", text)


def _counting(redact: Callable[[str], str]) -> tuple[Callable[[str], str], list[int]]:
    """`redact`, and a list that gets each call's input length."""
    calls: list[int] = []

    def counted(text: str) -> str:
        calls.append(len(text))
        return redact(text)

    return counted, calls


def _words(count: int) -> str:
    words = ("the", "engine", "streams", "a", "reply", "about", "wings", "and", "lift")
    return " ".join(words[i % len(words)] for i in range(count))


def test_one_character_deltas_cost_a_check_per_chunk(output: OutputGuardrails) -> None:
    text = _words(120)[:400]
    redact, calls = _counting(output.redactor())
    stream = StreamingRedactor(redact, window_chars=48, chunk_chars=32)
    out = "".join(stream.feed(ch) for ch in text) + stream.flush()
    assert out == text
    # One check per 32 new characters (plus the flush), not one or more per token: two
    # redact calls, the held text and what stays held; each scans the held window and the
    # new chunk, never the released text again.
    assert len(calls) <= 2 * (len(text) // 32) + 2, len(calls)
    assert max(calls) <= 48 + 32 + len("streams ")


def test_checks_are_due_only_once_a_chunk_came_in() -> None:
    stream = StreamingRedactor(lambda text: text, window_chars=48, chunk_chars=32)
    text = _words(200)
    due = []
    for i, ch in enumerate(text):
        if stream.add(ch):
            due.append(i)
            assert stream.release()
    assert due, "no check ran"
    gaps = [b - a for a, b in itertools.pairwise(due)]
    assert min(gaps) >= 32
    assert due[0] <= 48 + len("streams a ")  # the first release comes as early as the window allows


def test_an_answer_dense_with_entities_still_streams(output: OutputGuardrails) -> None:
    text = " ".join(f"user{i}@example.com" for i in range(12)) + " are the addresses."
    stream = StreamingRedactor(output.redactor(), window_chars=48)
    chunks = [stream.feed(text[i : i + 3]) for i in range(0, len(text), 3)]
    chunks.append(stream.flush())
    assert sum(1 for c in chunks if c) >= 4
    assert "".join(chunks) == output.redactor()(text)
    assert "@" not in "".join(chunks)


def test_the_words_before_a_secret_stay_with_it(output: OutputGuardrails) -> None:
    # Redacted alone, "hunter2secret" is no secret: the cut must not fall between them.
    text = "Log in with the admin account, the password: hunter2secret works until Monday."
    for window in (16, 24, 32):
        stream = StreamingRedactor(output.redactor(), window_chars=window, chunk_chars=8)
        out = "".join(stream.feed(ch) for ch in text) + stream.flush()
        assert "hunter2secret" not in out, window


def _as_tokens(text: str) -> list[str]:
    """Deltas shaped like a tokenizer's: a word with the space before it."""
    return re.findall(r"\s*\S+", text)


def test_the_first_words_go_out_before_the_window(output: OutputGuardrails) -> None:
    text = "Sure, here is what the handbook says about annual leave and the days you carry over."
    stream = output.streaming(None, window_chars=48)
    released, fed_at_first = "", None
    for token in _as_tokens(text):
        piece = stream.feed(token)
        if piece and fed_at_first is None:
            fed_at_first = len(released) + len(piece)
        released += piece
    assert released.startswith("Sure, ")
    # Released once its word ended and the next began, not 48 characters later.
    assert fed_at_first == len("Sure, ")
    assert released + stream.flush() == text


def test_a_policy_with_names_keeps_the_window(analyzer: AnalyzerEngine) -> None:
    # A name can take any word, so no word can be released before the window passes it.
    names = PiiRedactor(analyzer, PiiConfig(entities=["EMAIL_ADDRESS", "PERSON"]))
    output = OutputGuardrails(names, SecretsFilter(SecretsConfig()))
    text = "Sure, here is what the handbook says about annual leave and the days you carry over."
    assert output.hold_from(text[: text.index("what")]) is None
    stream = output.streaming(None, window_chars=48)
    fed = ""
    for token in _as_tokens(text):
        fed += token
        if piece := stream.feed(token):
            assert len(fed) - len(piece) >= 48
            break
    else:
        pytest.fail("nothing was released")

from __future__ import annotations

from collections.abc import Callable

from guardrails.pii import PiiRedactor
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

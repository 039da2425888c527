from __future__ import annotations

from retrieval import RetrievedChunk, format_context, select_for_prompt


def _chunk(title: str, source: str, text: str) -> RetrievedChunk:
    return RetrievedChunk(
        document_id="d", chunk_id=1, title=title, source=source, text=text, score=0.5
    )


def test_format_context_numbers_sources_in_given_order() -> None:
    context = format_context(
        [
            _chunk("VPN setup", "/docs/it/vpn.md", "Install WireGuard."),
            _chunk("Expenses", "expenses.txt", "Submit receipts."),
        ]
    )
    assert context == (
        "Use the following sources to answer. Cite them as [1], [2]...\n\n"
        "[1] VPN setup (vpn.md)\nInstall WireGuard.\n\n"
        "[2] Expenses (expenses.txt)\nSubmit receipts."
    )


def test_format_context_is_empty_without_chunks() -> None:
    assert format_context([]) == ""


def test_format_context_order_is_stable_and_budgeted() -> None:
    a = RetrievedChunk("d1", 5, "A", "/a.md", "alpha " * 10, 0.9, ordinal=1, page=3)
    b = RetrievedChunk("d1", 4, "A", "/a.md", "beta", 0.8, ordinal=0, section="Intro")
    c = RetrievedChunk("d2", 9, "C", "https://x.test/c", "gamma " * 200, 0.7)
    assert format_context([a, b]) == format_context([b, a])
    assert format_context([b, a]).index("[1] A (a.md, Intro)\nbeta") > 0
    assert "[2] A (a.md, p. 3)" in format_context([a, b])
    assert select_for_prompt([c, a, b], budget=300) == [b, a]
    assert "https://x.test/c" in format_context([c])
    words = select_for_prompt([a, b, c], budget=60, count_tokens=lambda t: len(t.split()))
    assert words == [b, a]

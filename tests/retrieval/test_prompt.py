from __future__ import annotations

from retrieval import RetrievedChunk, format_context


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

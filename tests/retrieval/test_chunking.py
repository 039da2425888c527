from __future__ import annotations

import itertools

import pytest

from retrieval import Section, chunk_sections, chunk_text, title_of
from retrieval.chunking import markdown_sections


def _sentences(count: int) -> str:
    return " ".join(f"Sentence number {i} talks about topic {i}." for i in range(count))


def test_heading_starts_new_chunk_and_stays_with_its_section() -> None:
    text = "Intro line.\n\n# Alpha\n\nAlpha body.\n\n## Beta\nBeta body.\n"
    assert chunk_text(text) == ["Intro line.", "# Alpha\n\nAlpha body.", "## Beta\n\nBeta body."]


def test_heading_followed_directly_by_subheading_is_not_a_chunk_of_its_own() -> None:
    chunks = chunk_text("# Guide\n## Install\nRun the installer.")
    assert chunks == ["# Guide\n\n## Install\n\nRun the installer."]


def test_hash_lines_inside_code_fences_are_not_headings() -> None:
    text = "# Setup\n\n```sh\n# not a heading\necho hi\n```\n"
    chunks = chunk_text(text)
    assert len(chunks) == 1
    assert "# not a heading" in chunks[0]
    assert title_of("```\n# comment\n```\n## Real title\n", "x") == "Real title"


def test_consecutive_chunks_of_a_section_overlap() -> None:
    chunks = chunk_text("# Topic\n\n" + _sentences(30), max_chars=200, overlap_chars=80)
    assert len(chunks) > 3
    assert chunks[0].startswith("# Topic")
    for previous, current in itertools.pairwise(chunks):
        first_sentence = current.split(".")[0] + "."
        assert first_sentence in previous, (previous, current)
    assert all(len(chunk) <= 200 for chunk in chunks)


def test_no_overlap_when_disabled_and_none_across_sections() -> None:
    chunks = chunk_text(_sentences(30), max_chars=200, overlap_chars=0)
    joined_lengths = sum(len(chunk) for chunk in chunks) + len(chunks) - 1
    assert joined_lengths == len(_sentences(30))

    sectioned = chunk_text("# A\n\nApples are red.\n\n# B\n\nBananas are yellow.", overlap_chars=50)
    assert sectioned == ["# A\n\nApples are red.", "# B\n\nBananas are yellow."]


def test_no_empty_chunks() -> None:
    assert chunk_text("") == []
    assert chunk_text("   \n\n\t\n  ") == []
    messy = "\n\n\nFirst.\n\n\n\n   \n\nSecond.\n\n# H\n\n\n\n"
    chunks = chunk_text(messy, max_chars=10, overlap_chars=2)
    assert chunks
    assert all(chunk.strip() for chunk in chunks)


def test_long_text_without_boundaries_is_cut_to_size() -> None:
    text = "x" * 2500 + " " + "word " * 400
    chunks = chunk_text(text, max_chars=300, overlap_chars=40)
    assert all(0 < len(chunk) <= 300 for chunk in chunks)
    assert "".join(chunks).count("x") >= 2500
    assert sum(chunk.count("word") for chunk in chunks) >= 400


def test_invalid_sizes_are_rejected() -> None:
    with pytest.raises(ValueError, match="overlap_chars"):
        chunk_text("text", max_chars=100, overlap_chars=100)
    with pytest.raises(ValueError, match="max_chars"):
        chunk_text("text", max_chars=0)


def test_title_of() -> None:
    assert title_of("Some text\n\n## Expense reports ##\nBody", "fallback") == "Expense reports"
    assert title_of("No heading here.\n#hashtag", "notes.txt") == "notes.txt"


def test_sizes_can_be_counted_in_tokens_and_chunks_keep_section_and_page() -> None:
    words = lambda text: len(text.split())  # noqa: E731 - a stand-in for a model tokenizer
    sections = [Section("# Guide", _sentences(40), "Guide", page=7)]
    chunks = chunk_sections(sections, max_size=50, overlap=10, count=words)
    assert len(chunks) > 3
    assert all(words(c.text) <= 50 for c in chunks)
    assert {(c.section, c.page) for c in chunks} == {("Guide", 7)}
    nested = markdown_sections("# A\n\ntext\n\n## B\n\nmore\n\n# C\n\nend")
    assert [s.path for s in nested] == [None, "A", "A > B", "C"]


def _words_at(text: str, start: int, end: int) -> list[str]:
    return text[start:end].split()


def test_chunk_spans_locate_each_chunk_in_the_document() -> None:
    long_sentence = " ".join(f"word{i}" for i in range(60)) + "."
    text = (
        "Preamble line one\r\nwraps here.\r\n\r\n# Alpha  \n\n"
        + _sentences(12).replace(". ", ".\n", 3)
        + "\n\n   \n## Beta\n"
        + long_sentence
        + "\n\nTail paragraph.\n"
    )
    chunks = chunk_sections(markdown_sections(text), max_size=120, overlap=30)
    assert len(chunks) > 5
    for chunk in chunks:
        # Same words in the same order: only the whitespace between them may differ.
        assert _words_at(text, chunk.start, chunk.end) == chunk.text.split(), chunk
        assert text[chunk.start] == chunk.text[0] and text[chunk.end - 1] == chunk.text[-1]
    assert chunks[0].start == 0
    assert text[chunks[1].start :].startswith("# Alpha")
    assert chunks[-1].end == text.index("Tail paragraph.") + len("Tail paragraph.")
    starts = [c.start for c in chunks]
    assert starts == sorted(starts)
    # Overlapping chunks overlap in the document too.
    alpha = [c for c in chunks if c.section == "Alpha"]
    assert any(b.start < a.end for a, b in itertools.pairwise(alpha))


def test_sections_offsets_default_to_the_start_of_a_standalone_body() -> None:
    chunks = chunk_sections([Section(None, "  One.\n\nTwo.", None)], max_size=5, overlap=0)
    assert [(c.text, c.start, c.end) for c in chunks] == [("One.", 2, 6), ("Two.", 8, 12)]

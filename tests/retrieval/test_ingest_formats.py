"""Each supported file type is ingested with the right per-chunk metadata."""

from __future__ import annotations

from pathlib import Path

import pytest

from retrieval import DocumentStore, chunk_sections
from retrieval.loaders import UnsupportedDocumentError, parse_document
from tests.retrieval._pdf import minimal_pdf

HTML = b"""<!doctype html><html><head><title>Wind tunnel guide</title>
<style>body { color: red }</style><script>var secret = "never indexed";</script></head>
<body><nav>Home | About</nav><p>Read this first.</p>
<h1>Calibration</h1><p>Calibrate the pitot tube every morning.</p>
<h2>Pressure sensors</h2><ul><li>Zero the manometer &amp; check the seals.</li></ul>
</body></html>"""


def test_html_sections_title_and_dropped_markup() -> None:
    parsed = parse_document("guide.html", HTML)
    assert parsed.kind == "html"
    assert parsed.title == "Wind tunnel guide"
    assert [s.path for s in parsed.sections] == [
        None,
        "Calibration",
        "Calibration > Pressure sensors",
    ]
    text = "\n".join(s.body for s in parsed.sections)
    assert "never indexed" not in text and "Home | About" not in text and "color" not in text
    assert "Zero the manometer & check the seals." in text


def test_unsupported_or_unreadable_files_raise() -> None:
    with pytest.raises(UnsupportedDocumentError, match="supported types"):
        parse_document("photo.png", b"\x89PNG")
    with pytest.raises(UnsupportedDocumentError, match="UTF-8"):
        parse_document("notes.txt", b"\xff\xfe\x00bad")
    with pytest.raises(UnsupportedDocumentError, match="cannot read PDF"):
        parse_document("broken.pdf", b"%PDF-1.4 not really")


def test_every_file_type_is_ingested_with_metadata(store: DocumentStore, tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "notes.txt").write_text("Plain notes about the hangar doors.", encoding="utf-8")
    (folder / "runbook.md").write_text(
        "# Runbook\n\nIntro.\n\n## Engine start\n\nPrime the fuel pump before ignition.",
        encoding="utf-8",
    )
    (folder / "guide.html").write_bytes(HTML)
    (folder / "manual.pdf").write_bytes(
        minimal_pdf(["Cover page of the manual.", "Torque the turbine bolts to 40 Nm."], "Manual")
    )
    results = store.ingest_paths([folder], "acme", "ops", progress=False)
    assert [r.status for r in results] == ["created"] * 4

    docs = {d.source.rsplit("/", 1)[-1]: d for d in store.list_documents("acme", "ops")}
    assert {name: (d.kind, d.title, d.version) for name, d in docs.items()} == {
        "guide.html": ("html", "Wind tunnel guide", 1),
        "manual.pdf": ("pdf", "Manual", 1),
        "notes.txt": ("text", "notes.txt", 1),
        "runbook.md": ("markdown", "Runbook", 1),
    }
    assert all(d.ingested_at is not None and d.chunks >= 1 for d in docs.values())

    def best(query: str) -> tuple[str, str | None, int | None]:
        hit = store.search("acme", ["ops"], query, top_k=1)[0]
        return Path(hit.source).name, hit.section, hit.page

    assert best("turbine bolt torque") == ("manual.pdf", None, 2)
    assert best("fuel pump ignition") == ("runbook.md", "Runbook > Engine start", None)
    assert best("zero the manometer seals") == (
        "guide.html",
        "Calibration > Pressure sensors",
        None,
    )


def test_ingest_bytes_names_the_source_and_sniffs_pdf(store: DocumentStore) -> None:
    data = minimal_pdf(["Upload without a suffix still parses as PDF."])
    result = store.ingest_bytes("acme", "uploads", "upload", data, source="https://x.test/u/1")
    info = store.get_document("acme", result.document_id)
    assert info is not None
    assert (info.kind, info.source, info.title, info.chunks) == (
        "pdf",
        "https://x.test/u/1",
        "1",
        1,
    )


def test_html_and_pdf_chunk_spans_index_the_extracted_text() -> None:
    for parsed in (
        parse_document("guide.html", HTML),
        parse_document("manual.pdf", minimal_pdf(["Cover page.", "Torque the bolts to 40 Nm."])),
    ):
        chunks = chunk_sections(parsed.sections, max_size=40, overlap=0)
        assert len(chunks) >= 2
        for chunk in chunks:
            assert parsed.text[chunk.start : chunk.end].split() == chunk.text.split()
    assert parsed.text[chunks[-1].start : chunks[-1].end] == "Torque the bolts to 40 Nm."
    assert chunks[-1].page == 2


def test_search_hits_carry_their_span_in_the_uploaded_file(store: DocumentStore) -> None:
    text = "# Hangar\n\nDoors open at six.\n\n## Fuel\n\nThe fuel truck parks by gate B.\n"
    store.ingest_bytes("acme", "ops", "hangar.md", text.encode("utf-8"))
    hit = store.search("acme", ["ops"], "where does the fuel truck park", top_k=1)[0]
    assert (hit.section, hit.page) == ("Hangar > Fuel", None)
    assert hit.char_start is not None and hit.char_end is not None
    assert text[hit.char_start : hit.char_end] == "## Fuel\n\nThe fuel truck parks by gate B."

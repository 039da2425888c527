"""Turn uploaded bytes (text, Markdown, HTML, PDF) into titled sections for chunking."""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, replace
from html.parser import HTMLParser
from pathlib import PurePath
from typing import Literal

from retrieval.chunking import Section, markdown_sections, title_of

Kind = Literal["text", "markdown", "html", "pdf"]

SUFFIX_KINDS: dict[str, Kind] = {
    ".txt": "text",
    ".text": "text",
    ".md": "markdown",
    ".markdown": "markdown",
    ".html": "html",
    ".htm": "html",
    ".pdf": "pdf",
}


class UnsupportedDocumentError(ValueError):
    """The file is of a type we cannot ingest, or its content cannot be read as that type."""


@dataclass(frozen=True, slots=True)
class ParsedDocument:
    """What a loader found: the document's kind, its title (if it names one), its sections,
    and its text, in which the sections' offsets (and so chunk spans) are counted.

    The text of a text or Markdown file is the file itself; that of HTML and PDF is what was
    extracted: headings and bodies (PDF: pages) in order, separated by blank lines.
    """

    kind: Kind
    title: str | None
    sections: list[Section]
    text: str


def kind_of(filename: str, data: bytes = b"") -> Kind:
    """The kind of a file by its suffix, or by its first bytes when the suffix says nothing."""
    suffix = PurePath(filename).suffix.lower()
    if suffix in SUFFIX_KINDS:
        return SUFFIX_KINDS[suffix]
    head = data[:1024].lstrip().lower()
    if head.startswith(b"%pdf-"):
        return "pdf"
    if head.startswith((b"<!doctype html", b"<html")):
        return "html"
    if suffix == "":
        return "text"
    raise UnsupportedDocumentError(
        f"cannot ingest {filename!r}: supported types are {', '.join(sorted(SUFFIX_KINDS))}"
    )


def parse_document(filename: str, data: bytes) -> ParsedDocument:
    """Parse `data` by the kind `filename` (or the bytes themselves) indicate."""
    kind = kind_of(filename, data)
    if kind == "pdf":
        return _parse_pdf(filename, data)
    text = _decode(filename, data)
    if kind == "html":
        return parse_html(text)
    # Plain text may still open with a Markdown heading; without one the store uses the name.
    return parse_markdown(text, kind)


def parse_markdown(text: str, kind: Kind = "markdown") -> ParsedDocument:
    """Markdown (or plain text, which may still open with a Markdown heading)."""
    return ParsedDocument(kind, title_of(text, "") or None, markdown_sections(text), text)


def parse_html(html: str) -> ParsedDocument:
    """Headings (h1-h6) become sections; scripts, styles and navigation are dropped."""
    parser = _HtmlToSections()
    parser.feed(html)
    parser.close()
    text, sections = _placed(parser.sections())
    return ParsedDocument("html", parser.title(), sections, text)


def _placed(sections: list[Section]) -> tuple[str, list[Section]]:
    """The extracted text of `sections` (blocks separated by blank lines), and the sections
    with their offsets in it."""
    parts: list[str] = []
    placed: list[Section] = []
    offset = 0
    for section in sections:
        heading_start = offset
        if section.heading is not None:
            parts += [section.heading, "\n\n"]
            offset += len(section.heading) + 2
        placed.append(replace(section, body_start=offset, heading_start=heading_start))
        parts += [section.body, "\n\n"]
        offset += len(section.body) + 2
    return "".join(parts)[:-2], placed


def _decode(filename: str, data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise UnsupportedDocumentError(f"{filename!r} is not UTF-8 text: {error}") from error


def _parse_pdf(filename: str, data: bytes) -> ParsedDocument:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        pages = [page.extract_text() or "" for page in reader.pages]
        title = reader.metadata.title if reader.metadata is not None else None
    except (PdfReadError, ValueError, KeyError) as error:
        raise UnsupportedDocumentError(f"cannot read PDF {filename!r}: {error}") from error
    # Each page is its own section so that every chunk knows its page number.
    text, sections = _placed(
        [
            Section(None, _PDF_HYPHEN.sub("", text), None, number)
            for number, text in enumerate(pages, start=1)
            if text.strip()
        ]
    )
    return ParsedDocument("pdf", (title or "").strip() or None, sections, text)


_PDF_HYPHEN = re.compile(r"(?<=\w)-\n(?=\w)")
_HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
_BLOCKS = frozenset(
    {"p", "div", "li", "ul", "ol", "pre", "blockquote", "table", "tr", "section", "article"}
    | {"br", "hr", "dd", "dt", "figcaption", "main", "header", "footer"}
)
_SKIPPED = frozenset({"script", "style", "nav", "noscript", "template", "svg"})
_SPACES = re.compile(r"[ \t\r\f\v]+")


class _HtmlToSections(HTMLParser):
    """Collects text per heading; block elements become paragraph breaks."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self._skip_depth = 0
        self._in_title = False
        self._title: list[str] = []
        self._heading_level: int | None = None
        self._heading_text: list[str] = []
        self._trail: list[tuple[int, str]] = []
        self._current: tuple[str | None, str | None] = (None, None)
        self._body: list[str] = []
        self._sections: list[Section] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIPPED:
            self._skip_depth += 1
        elif tag == "title":
            self._in_title = True
        elif tag in _HEADINGS:
            self._heading_level = _HEADINGS[tag]
            self._heading_text = []
        elif tag in _BLOCKS:
            self._body.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIPPED:
            self._skip_depth = max(0, self._skip_depth - 1)
        elif tag == "title":
            self._in_title = False
        elif tag in _HEADINGS and self._heading_level is not None:
            self._start_section(self._heading_level, _clean("".join(self._heading_text)))
            self._heading_level = None
        elif tag in _BLOCKS:
            self._body.append("\n\n")

    def handle_data(self, data: str) -> None:
        if self._skip_depth:
            return
        if self._in_title:
            self._title.append(data)
        elif self._heading_level is not None:
            self._heading_text.append(data)
        else:
            self._body.append(data)

    def _start_section(self, level: int, name: str) -> None:
        self._flush()
        if not name:
            return
        self._trail = [(lvl, n) for lvl, n in self._trail if lvl < level]
        self._trail.append((level, name))
        path = " > ".join(n for _, n in self._trail)
        self._current = (f"{'#' * level} {name}", path)

    def _flush(self) -> None:
        body = "\n\n".join(
            _clean(part) for part in re.split(r"\n\s*\n", "".join(self._body)) if part.strip()
        )
        heading, path = self._current
        self._sections.append(Section(heading, body, path))
        self._body = []

    def title(self) -> str | None:
        title = _clean("".join(self._title))
        if title:
            return title
        first = next((s.path for s in self._sections if s.path), None)
        return first.split(" > ")[0] if first else None

    def sections(self) -> list[Section]:
        self._flush()
        self._current = (None, None)
        return [s for s in self._sections if s.heading is not None or s.body.strip()]


def _clean(text: str) -> str:
    return "\n".join(_SPACES.sub(" ", line).strip() for line in text.splitlines()).strip()

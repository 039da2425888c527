"""Split documents into overlapping chunks that respect headings, paragraphs and sentences."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

_HEADING = re.compile(r"^ {0,3}(?P<marks>#{1,6})[ \t]+(?P<title>.+?)(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(?:```|~~~)")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n")
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"\S+")

CountFn = Callable[[str], int]
"""Measures a piece of text: `len` for characters, or a chat model's token counter."""


@dataclass(frozen=True, slots=True)
class Section:
    """A run of text under one heading, as a loader found it.

    `heading` is the line repeated at the top of the section's first chunk (None for text
    before any heading); `path` names the section for metadata ("Guide > Install").
    `body_start` and `heading_start` are where `body` and `heading` begin in the document's
    text, so that each chunk knows its span there.
    """

    heading: str | None
    body: str
    path: str | None = None
    page: int | None = None
    body_start: int = 0
    heading_start: int = 0


@dataclass(frozen=True, slots=True)
class TextChunk:
    """One chunk of a document with the section and page it came from.

    `start`:`end` is its span in the document's text, from its first character to its last;
    the text between may differ from `text` in whitespace (paragraphs are joined by a blank
    line, and a section's heading leads its first chunk).
    """

    text: str
    section: str | None
    page: int | None
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class _Piece:
    """The smallest unit packed into a chunk; `sep` joins it to the piece before it.

    `text` is the document's text from `start` to `end`.
    """

    text: str
    sep: str
    size: int
    start: int
    end: int


def chunk_text(text: str, max_chars: int = 800, overlap_chars: int = 120) -> list[str]:
    """Split Markdown or plain `text` into chunks of at most `max_chars` characters.

    Every Markdown heading starts a new chunk and stays with its section. Sections are cut at
    paragraph, then sentence, then word boundaries; consecutive chunks of one section share up
    to `overlap_chars` characters so that a sentence near a cut keeps some context.
    """
    return [c.text for c in chunk_sections(markdown_sections(text), max_chars, overlap_chars)]


def chunk_sections(
    sections: Sequence[Section], max_size: int = 800, overlap: int = 120, count: CountFn = len
) -> list[TextChunk]:
    """Pack `sections` into chunks of at most `max_size`, measured by `count`.

    With a token counter the sizes are the sum of the pieces' counts, a close upper bound
    of the joined text's count. A heading with no body of its own joins the next section.
    """
    if max_size <= 0:
        raise ValueError(f"max_chars must be positive, got {max_size}")
    if not 0 <= overlap < max_size:
        raise ValueError(f"overlap_chars must be in [0, max_chars), got {overlap}")
    chunks: list[TextChunk] = []
    pending: list[_Piece] = []
    for section in sections:
        body_pieces = _body_pieces(section.body, section.body_start, max_size, count)
        if section.heading is not None:
            pending.append(_piece(section.heading, "\n\n", count, section.heading_start))
        if not body_pieces:
            continue
        for packed in _pack([*pending, *body_pieces], max_size, overlap, count):
            chunks.append(_chunk(packed, section))
        pending = []
    if pending:
        for packed in _pack(pending, max_size, overlap, count):
            chunks.append(_chunk(packed, sections[-1]))
    return chunks


def _chunk(pieces: list[_Piece], section: Section) -> TextChunk:
    return TextChunk(_join(pieces), section.path, section.page, pieces[0].start, pieces[-1].end)


def markdown_sections(text: str, page: int | None = None) -> list[Section]:
    """Sections of Markdown `text` at its headings; `#` lines inside code fences are kept.

    Each body is the exact slice of `text` between its heading line and the next one.
    """
    sections: list[Section] = []
    trail: list[tuple[int, str]] = []
    heading: str | None = None
    heading_start = body_start = offset = 0
    in_fence = False
    for line in text.splitlines(keepends=True):
        start, offset = offset, offset + len(line)
        content = line.splitlines()[0]
        if _FENCE.match(content):
            in_fence = not in_fence
        elif not in_fence and (match := _HEADING.match(content)):
            body = text[body_start:start]
            sections.append(Section(heading, body, _path(trail), page, body_start, heading_start))
            level = len(match.group("marks"))
            trail = [(lvl, name) for lvl, name in trail if lvl < level]
            trail.append((level, match.group("title").strip()))
            heading = content.strip()
            heading_start = start + len(content) - len(content.lstrip())
            body_start = offset
    body = text[body_start:]
    sections.append(Section(heading, body, _path(trail), page, body_start, heading_start))
    return sections


def title_of(text: str, fallback: str) -> str:
    """The text of the first Markdown heading in `text`, else `fallback`."""
    in_fence = False
    for line in text.splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and (match := _HEADING.match(line)):
            return match.group("title").strip()
    return fallback


def _path(trail: list[tuple[int, str]]) -> str | None:
    return " > ".join(name for _, name in trail) or None


def _piece(text: str, sep: str, count: CountFn, start: int) -> _Piece:
    return _Piece(text, sep, count(sep) + count(text), start, start + len(text))


def _trimmed_parts(text: str, breaks: re.Pattern[str]) -> list[tuple[int, int]]:
    """(start, end) of the parts of `text` between `breaks`, without outer whitespace."""
    bounds = [0, *(i for m in breaks.finditer(text) for i in m.span()), len(text)]
    parts = []
    for start, end in zip(bounds[::2], bounds[1::2], strict=True):
        part = text[start:end]
        stripped = part.strip()
        if stripped:
            first = start + len(part) - len(part.lstrip())
            parts.append((first, first + len(stripped)))
    return parts


def _body_pieces(body: str, offset: int, max_size: int, count: CountFn) -> list[_Piece]:
    """Paragraphs of `body` (which starts at `offset`), cut further where too long."""
    pieces: list[_Piece] = []
    for start, end in _trimmed_parts(body, _PARAGRAPH_BREAK):
        paragraph = body[start:end]
        if count(paragraph) <= max_size:
            pieces.append(_piece(paragraph, "\n\n", count, offset + start))
            continue
        sep = "\n\n"
        for first, last in _trimmed_parts(paragraph, _SENTENCE_BREAK):
            for part_start, part_end in _split_words(paragraph[first:last], max_size, count):
                begin = offset + start + first + part_start
                pieces.append(
                    _piece(paragraph[first + part_start : first + part_end], sep, count, begin)
                )
                sep = " "
    return pieces


def _split_words(sentence: str, limit: int, count: CountFn) -> list[tuple[int, int]]:
    """Cut a sentence longer than `limit` at spaces, and words longer than `limit` anywhere;
    returns the (start, end) of each part in `sentence`."""
    if count(sentence) <= limit:
        return [(0, len(sentence))]
    parts: list[tuple[int, int]] = []
    start = end = size = 0
    for match in _WORD.finditer(sentence):
        word_start = match.start()
        # A slice of `limit` characters never holds more than `limit` tokens.
        while count(sentence[word_start : match.end()]) > limit:
            if size:
                parts.append((start, end))
                size = 0
            parts.append((word_start, word_start + limit))
            word_start += limit
        word = count(sentence[word_start : match.end()])
        gap = count(sentence[end:word_start])
        if size and size + gap + word > limit:
            parts.append((start, end))
            size = 0
        if size:
            size += gap + word
        else:
            start, size = word_start, word
        end = match.end()
    if size:
        parts.append((start, end))
    return parts


def _join(pieces: list[_Piece]) -> str:
    return pieces[0].text + "".join(p.sep + p.text for p in pieces[1:])


def _size(pieces: list[_Piece], count: CountFn) -> int:
    """Size of the joined pieces: the first one's separator is not part of the chunk."""
    return sum(p.size for p in pieces) - count(pieces[0].sep) if pieces else 0


def _pack(pieces: list[_Piece], max_size: int, overlap: int, count: CountFn) -> list[list[_Piece]]:
    chunks: list[list[_Piece]] = []
    current: list[_Piece] = []
    for piece in pieces:
        if current and _size([*current, piece], count) > max_size:
            chunks.append(current)
            current = _overlap(current, overlap, count)
            if current and _size([*current, piece], count) > max_size:
                current = []
        current.append(piece)
    if current:
        chunks.append(current)
    return chunks


def _overlap(pieces: list[_Piece], limit: int, count: CountFn) -> list[_Piece]:
    """The trailing whole pieces that fit in `limit`, else the last piece's trailing words."""
    if limit <= 0:
        return []
    start = len(pieces)
    while start > 0 and _size(pieces[start - 1 :], count) <= limit:
        start -= 1
    if start < len(pieces):
        return pieces[start:]
    last = pieces[-1]
    tail: _Piece | None = None
    for word in reversed(list(_WORD.finditer(last.text))[1:]):
        text = last.text[word.start() :]
        size = count(text)
        if size > limit:
            break
        tail = _Piece(text, "", size, last.start + word.start(), last.end)
    return [tail] if tail is not None else []

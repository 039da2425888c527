"""Split documents into overlapping chunks that respect headings, paragraphs and sentences."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

_HEADING = re.compile(r"^ {0,3}(?P<marks>#{1,6})[ \t]+(?P<title>.+?)(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(?:```|~~~)")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+")

CountFn = Callable[[str], int]
"""Measures a piece of text: `len` for characters, or a chat model's token counter."""


@dataclass(frozen=True, slots=True)
class Section:
    """A run of text under one heading, as a loader found it.

    `heading` is the line repeated at the top of the section's first chunk (None for text
    before any heading); `path` names the section for metadata ("Guide > Install").
    """

    heading: str | None
    body: str
    path: str | None = None
    page: int | None = None


@dataclass(frozen=True, slots=True)
class TextChunk:
    """One chunk of a document with the section and page it came from."""

    text: str
    section: str | None
    page: int | None


@dataclass(frozen=True, slots=True)
class _Piece:
    """The smallest unit packed into a chunk; `sep` joins it to the piece before it."""

    text: str
    sep: str
    size: int


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
        body_pieces = _body_pieces(section.body, max_size, count)
        if section.heading is not None:
            pending.append(_piece(section.heading, "\n\n", count))
        if not body_pieces:
            continue
        for text in _pack([*pending, *body_pieces], max_size, overlap, count):
            chunks.append(TextChunk(text, section.path, section.page))
        pending = []
    if pending:
        last = sections[-1]
        for text in _pack(pending, max_size, overlap, count):
            chunks.append(TextChunk(text, last.path, last.page))
    return chunks


def markdown_sections(text: str, page: int | None = None) -> list[Section]:
    """Sections of Markdown `text` at its headings; `#` lines inside code fences are kept."""
    sections: list[Section] = []
    trail: list[tuple[int, str]] = []
    heading: str | None = None
    body: list[str] = []
    in_fence = False
    for line in text.splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and (match := _HEADING.match(line)):
            sections.append(Section(heading, "\n".join(body), _path(trail), page))
            level = len(match.group("marks"))
            trail = [(lvl, name) for lvl, name in trail if lvl < level]
            trail.append((level, match.group("title").strip()))
            heading, body = line.strip(), []
            continue
        body.append(line)
    sections.append(Section(heading, "\n".join(body), _path(trail), page))
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


def _piece(text: str, sep: str, count: CountFn) -> _Piece:
    return _Piece(text, sep, count(sep) + count(text))


def _body_pieces(body: str, max_size: int, count: CountFn) -> list[_Piece]:
    pieces: list[_Piece] = []
    for paragraph in _PARAGRAPH_BREAK.split(body):
        paragraph = paragraph.strip()
        if not paragraph:
            continue
        if count(paragraph) <= max_size:
            pieces.append(_piece(paragraph, "\n\n", count))
            continue
        sep = "\n\n"
        for sentence in _SENTENCE_BREAK.split(paragraph):
            for part in _split_words(sentence, max_size, count):
                pieces.append(_piece(part, sep, count))
                sep = " "
    return pieces


def _split_words(sentence: str, limit: int, count: CountFn) -> list[str]:
    """Cut a sentence longer than `limit` at spaces, and words longer than `limit` anywhere."""
    if count(sentence) <= limit:
        return [sentence] if sentence.strip() else []
    parts: list[str] = []
    current, current_size = "", 0
    space = count(" ")
    for word in sentence.split():
        # A slice of `limit` characters never holds more than `limit` tokens.
        while count(word) > limit:
            if current:
                parts.append(current)
                current, current_size = "", 0
            parts.append(word[:limit])
            word = word[limit:]
        size = count(word)
        if current and current_size + space + size > limit:
            parts.append(current)
            current, current_size = "", 0
        if current:
            current, current_size = f"{current} {word}", current_size + space + size
        else:
            current, current_size = word, size
    if current:
        parts.append(current)
    return parts


def _join(pieces: list[_Piece]) -> str:
    return pieces[0].text + "".join(p.sep + p.text for p in pieces[1:])


def _size(pieces: list[_Piece], count: CountFn) -> int:
    """Size of the joined pieces: the first one's separator is not part of the chunk."""
    return sum(p.size for p in pieces) - count(pieces[0].sep) if pieces else 0


def _pack(pieces: list[_Piece], max_size: int, overlap: int, count: CountFn) -> list[str]:
    chunks: list[str] = []
    current: list[_Piece] = []
    for piece in pieces:
        if current and _size([*current, piece], count) > max_size:
            chunks.append(_join(current))
            current = _overlap(current, overlap, count)
            if current and _size([*current, piece], count) > max_size:
                current = []
        current.append(piece)
    if current:
        chunks.append(_join(current))
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
    words = pieces[-1].text.split()
    tail: list[str] = []
    size = 0
    space = count(" ")
    for word in reversed(words[1:]):
        grown = size + count(word) + (space if tail else 0)
        if grown > limit:
            break
        tail.insert(0, word)
        size = grown
    return [_Piece(" ".join(tail), "", size)] if tail else []

"""Split Markdown or plain text into overlapping chunks sized for embedding."""

from __future__ import annotations

import re
from dataclasses import dataclass

_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(?P<title>.+?)(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(?:```|~~~)")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True, slots=True)
class _Piece:
    """The smallest unit packed into a chunk; `sep` joins it to the piece before it."""

    text: str
    sep: str


def chunk_text(text: str, max_chars: int = 800, overlap_chars: int = 120) -> list[str]:
    """Split `text` into chunks of at most `max_chars` characters.

    Every Markdown heading starts a new chunk and stays with its section. Sections are cut at
    paragraph, then sentence, then word boundaries; consecutive chunks of one section share up
    to `overlap_chars` characters so that a sentence near a cut keeps some context.
    """
    if max_chars <= 0:
        raise ValueError(f"max_chars must be positive, got {max_chars}")
    if not 0 <= overlap_chars < max_chars:
        raise ValueError(f"overlap_chars must be in [0, max_chars), got {overlap_chars}")
    chunks: list[str] = []
    pending_headings: list[str] = []
    for heading, body in _sections(text):
        body_pieces = _body_pieces(body, max_chars)
        if heading is not None:
            pending_headings.append(heading)
        if not body_pieces:
            # A heading directly followed by a sub-heading joins the sub-heading's chunk.
            continue
        headings = [_Piece(h, "\n\n") for h in pending_headings]
        pending_headings = []
        chunks.extend(_pack([*headings, *body_pieces], max_chars, overlap_chars))
    if pending_headings:
        pieces = [_Piece(h, "\n\n") for h in pending_headings]
        chunks.extend(_pack(pieces, max_chars, overlap_chars))
    return chunks


def title_of(text: str, fallback: str) -> str:
    """The text of the first Markdown heading in `text`, else `fallback`."""
    in_fence = False
    for line in text.splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and (match := _HEADING.match(line)):
            return match.group("title").strip()
    return fallback


def _sections(text: str) -> list[tuple[str | None, str]]:
    """(heading line, body) pairs; the first section has no heading. Ignores code fences."""
    sections: list[tuple[str | None, str]] = []
    heading: str | None = None
    body: list[str] = []
    in_fence = False
    for line in text.splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and _HEADING.match(line):
            sections.append((heading, "\n".join(body)))
            heading, body = line.strip(), []
            continue
        body.append(line)
    sections.append((heading, "\n".join(body)))
    return sections


def _body_pieces(body: str, max_chars: int) -> list[_Piece]:
    pieces: list[_Piece] = []
    for paragraph in _PARAGRAPH_BREAK.split(body):
        paragraph = paragraph.strip()
        if not paragraph:
            continue
        if len(paragraph) <= max_chars:
            pieces.append(_Piece(paragraph, "\n\n"))
            continue
        sep = "\n\n"
        for sentence in _SENTENCE_BREAK.split(paragraph):
            for part in _split_words(sentence, max_chars):
                pieces.append(_Piece(part, sep))
                sep = " "
    return pieces


def _split_words(sentence: str, limit: int) -> list[str]:
    """Cut a sentence longer than `limit` at spaces, and words longer than `limit` anywhere."""
    if len(sentence) <= limit:
        return [sentence] if sentence.strip() else []
    parts: list[str] = []
    current = ""
    for word in sentence.split():
        while len(word) > limit:
            if current:
                parts.append(current)
                current = ""
            parts.append(word[:limit])
            word = word[limit:]
        if current and len(current) + 1 + len(word) > limit:
            parts.append(current)
            current = ""
        current = f"{current} {word}" if current else word
    if current:
        parts.append(current)
    return parts


def _join(pieces: list[_Piece]) -> str:
    return pieces[0].text + "".join(p.sep + p.text for p in pieces[1:])


def _pack(pieces: list[_Piece], max_chars: int, overlap_chars: int) -> list[str]:
    chunks: list[str] = []
    current: list[_Piece] = []
    for piece in pieces:
        if current and len(_join([*current, piece])) > max_chars:
            chunks.append(_join(current))
            current = _overlap(current, overlap_chars)
            if current and len(_join([*current, piece])) > max_chars:
                current = []
        current.append(piece)
    if current:
        chunks.append(_join(current))
    return chunks


def _overlap(pieces: list[_Piece], limit: int) -> list[_Piece]:
    """The trailing whole pieces that fit in `limit`, else the last piece's trailing words."""
    if limit <= 0:
        return []
    start = len(pieces)
    while start > 0 and len(_join(pieces[start - 1 :])) <= limit:
        start -= 1
    if start < len(pieces):
        return pieces[start:]
    last = pieces[-1].text
    tail = last[-limit:]
    if not last[-limit - 1].isspace():
        # The cut landed inside a word: drop the partial word.
        parts = tail.split(maxsplit=1)
        tail = parts[1] if len(parts) == 2 else ""
    tail = tail.strip()
    return [_Piece(tail, "")] if tail else []

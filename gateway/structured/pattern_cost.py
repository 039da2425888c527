"""What a `pattern` costs xgrammar to compile, estimated before it is compiled.

xgrammar turns a pattern into an automaton (no backtracking, so `^(a+)+$` is cheap), but
counted repetition is unrolled into states and each state's token mask is computed over
the whole vocabulary: `^(.{1,10}){1,5}$` took 4.7 s of CPU on SmolLM2's 49k tokens and
`^(.{1,10}){1,100}$` seven minutes. The estimate multiplies each atom's weight by the
counts of the repetitions around it, and once more by the count when a repetition's body
has no fixed length (those multiply the automaton's states, not only its length).

One cost unit is about 13 µs of one core (measured: `^.{95}$` is estimated at 57,525
units and took 512 ms).
Lookaround, back-references, word boundaries and `\\p{...}` classes are refused: xgrammar
ignores lookaround (`^(?=b)a$` accepts "a") and rejects or misreads the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LITERAL = 1  # one character: its mask is cheap
NARROW = 100  # a class such as [a-z], \d, \w, or an alternation such as (a|b|c)
WIDE = 600  # ., a negated class, \D, \W, \S, or a class of more than 128 characters
BASE = 500  # each pattern is an automaton of its own
_WIDE_CLASS_SIZE = 128

# How many characters a class escape admits.
_CLASS_ESCAPES = {"d": 10, "w": 63, "s": 6}
_WIDE_ESCAPES = frozenset("DWS")


class PatternRefused(ValueError):
    """A pattern the constraint cannot enforce as written."""


@dataclass(slots=True)
class _Piece:
    """A parsed atom or group: its cost, and its length when that is fixed."""

    cost: int
    length: int | None


@dataclass(slots=True)
class _Group:
    """An open group: finished alternatives, and the sequence being read."""

    alternatives: list[_Piece] = field(default_factory=list)
    sequence: list[_Piece] = field(default_factory=list)

    def close_alternative(self) -> None:
        cost = sum(piece.cost for piece in self.sequence)
        lengths = [piece.length for piece in self.sequence]
        length = None if None in lengths else sum(x for x in lengths if x is not None)
        self.alternatives.append(_Piece(cost, length))
        self.sequence = []

    def close(self) -> _Piece:
        """The group as one piece; alternatives cost at least a class (`(a|b|...|z){100}`
        costs what `[a-z]{100}` does)."""
        self.close_alternative()
        lengths = {piece.length for piece in self.alternatives}
        length = lengths.pop() if len(lengths) == 1 else None
        cost = sum(piece.cost for piece in self.alternatives)
        return _Piece(max(cost, NARROW) if len(self.alternatives) > 1 else cost, length)


def pattern_cost(pattern: str, limit: int) -> int:
    """The estimated compile cost of `pattern` (capped just above `limit`); raise
    PatternRefused for a construct the constraint does not enforce."""
    stack = [_Group()]
    i = 0
    while i < len(pattern):
        char = pattern[i]
        group = stack[-1]
        if char == "\\":
            piece, i = _escape(pattern, i)
            group.sequence.append(piece)
        elif char == "[":
            piece, i = _char_class(pattern, i)
            group.sequence.append(piece)
        elif char == "(":
            i = _open_group(pattern, i)
            stack.append(_Group())
        elif char == ")":
            if len(stack) == 1:
                raise PatternRefused(f"unbalanced ')' at position {i}")
            closed = stack.pop().close()
            stack[-1].sequence.append(closed)
            i += 1
        elif char == "|":
            group.close_alternative()
            i += 1
        elif char in "*+?{":
            bounds, end = _quantifier(pattern, i)
            if bounds is None:  # a brace that starts no count is a literal
                group.sequence.append(_Piece(LITERAL, 1))
                i += 1
                continue
            if not group.sequence:
                raise PatternRefused(f"a repetition at position {i} repeats nothing")
            group.sequence[-1] = _repeat(group.sequence[-1], *bounds, limit)
            i = end
        elif char in "^$":
            group.sequence.append(_Piece(0, 0))
            i += 1
        else:
            group.sequence.append(_Piece(WIDE if char == "." else LITERAL, 1))
            i += 1
    if len(stack) != 1:
        raise PatternRefused("a group is not closed")
    return min(BASE + stack[0].close().cost, limit + 1)


def _repeat(piece: _Piece, low: int, high: int | None, limit: int) -> _Piece:
    """`piece` repeated `low` to `high` times (None: unbounded)."""
    count = max(low if high is None else high, 1)
    factor = count * count if piece.length is None and count > 1 else count
    length = piece.length * low if piece.length is not None and low == high else None
    return _Piece(min(piece.cost * factor, limit + 1), length)


def _quantifier(pattern: str, i: int) -> tuple[tuple[int, int | None] | None, int]:
    """The bounds of the quantifier at `i` and the index after it (and its lazy `?` or
    possessive `+`); None for a `{` that is not a count."""
    char = pattern[i]
    if char == "*":
        bounds: tuple[int, int | None] = (0, None)
        end = i + 1
    elif char == "+":
        bounds, end = (1, None), i + 1
    elif char == "?":
        bounds, end = (0, 1), i + 1
    else:
        close = pattern.find("}", i)
        body = pattern[i + 1 : close] if close > 0 else ""
        low, _, high = body.partition(",")
        if not low.isdigit() or (high and not high.isdigit()):
            return None, i
        if "," not in body:
            bounds = (int(low), int(low))
        else:
            bounds = (int(low), int(high) if high else None)
        end = close + 1
    if end < len(pattern) and pattern[end] in "?+":
        end += 1
    return bounds, end


def _open_group(pattern: str, i: int) -> int:
    """The index after a group's opening: `(`, `(?:`, `(?<name>` or `(?P<name>`."""
    rest = pattern[i + 1 : i + 4]
    if not rest.startswith("?"):
        return i + 1
    if rest.startswith("?:"):
        return i + 3
    if rest.startswith(("?=", "?!", "?<=", "?<!")):
        raise PatternRefused(
            f"lookaround at position {i} is not supported: the constraint ignores it"
        )
    if rest.startswith(("?<", "?P<")):
        close = pattern.find(">", i)
        if close < 0:
            raise PatternRefused(f"an unfinished group name at position {i}")
        return close + 1
    raise PatternRefused(
        f"the group '(?{pattern[i + 2 : i + 3]}' at position {i} is not supported "
        "(inline flags, comments and back-references are not)"
    )


def _escape(pattern: str, i: int) -> tuple[_Piece, int]:
    """The escape at `i` as an atom, and the index after it."""
    if i + 1 >= len(pattern):
        raise PatternRefused("the pattern ends with a lone backslash")
    char = pattern[i + 1]
    if char in "bB":
        raise PatternRefused(f"word boundaries (\\{char}) are not supported")
    if (char.isdigit() and char != "0") or char == "k":
        raise PatternRefused(f"back-references (\\{char}) are not supported")
    if char in "pP":
        raise PatternRefused(f"Unicode property classes (\\{char}{{...}}) are not supported")
    if char in _WIDE_ESCAPES:
        return _Piece(WIDE, 1), i + 2
    if char in _CLASS_ESCAPES:
        return _Piece(NARROW, 1), i + 2
    return _Piece(LITERAL, 1), _after_escape(pattern, i)


def _after_escape(pattern: str, i: int) -> int:
    """The index after a literal escape: `\\uXXXX`, `\\u{...}`, `\\xHH`, `\\cX` or one char."""
    char = pattern[i + 1]
    if char == "u" and pattern[i + 2 : i + 3] == "{":
        close = pattern.find("}", i)
        return close + 1 if close > 0 else len(pattern)
    return i + {"u": 6, "x": 4, "c": 3}.get(char, 2)


def _char_class(pattern: str, i: int) -> tuple[_Piece, int]:
    """The class `[...]` at `i` as one atom weighed by how many characters it admits."""
    j = i + 1
    negated = pattern[j : j + 1] == "^"
    if negated:
        j += 1
    size = 0
    wide = negated
    first = True
    previous: str | None = None
    while j < len(pattern) and (pattern[j] != "]" or first):
        first = False
        char = pattern[j]
        if char == "\\" and j + 1 < len(pattern):
            escaped = pattern[j + 1]
            if escaped in "pP":
                raise PatternRefused("Unicode property classes (\\p{...}) are not supported")
            wide = wide or escaped in _WIDE_ESCAPES
            size += _CLASS_ESCAPES.get(escaped, 1)
            previous = None
            j = _after_escape(pattern, j)
            continue
        if char == "-" and previous is not None and pattern[j + 1 : j + 2] not in ("]", ""):
            size += abs(ord(pattern[j + 1]) - ord(previous))
            previous = None
            j += 2
            continue
        size += 1
        previous = char
        j += 1
    if j >= len(pattern):
        raise PatternRefused(f"the class opened at position {i} is not closed")
    if wide or size > _WIDE_CLASS_SIZE:
        return _Piece(WIDE, 1), j + 1
    return _Piece(NARROW if size > 1 else LITERAL, 1), j + 1

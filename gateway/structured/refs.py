"""`$ref` in a client schema: only pointers into the schema itself, and cycles found
without recursion.

xgrammar 0.2.9 resolves `#` and `#/...` JSON pointers (percent- and ~-escapes included)
and compiles recursive schemas (a tree of nodes) into a recursive grammar. A cycle that
never descends into a property or an item would match no content: xgrammar refuses a
direct one and loops on others, and jsonschema recurses without end, so it is refused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from urllib.parse import unquote

from gateway.structured.document import Path, json_path
from gateway.structured.errors import SchemaProblem


def ref_target(root: object, ref: str, at: Path) -> Path:
    """The path of the value `ref` (at `at`) points at; refuse a reference outside the
    schema or to nothing."""
    where = f"'$ref' {ref!r} at {json_path(at)}"
    if not ref.startswith("#"):
        raise SchemaProblem(
            f"{where} is not supported: only references inside the schema (#/...) are; "
            "remote references are refused"
        )
    pointer = unquote(ref[1:])
    if pointer == "":
        return ()
    if not pointer.startswith("/"):
        raise SchemaProblem(f"{where} is not supported: only JSON pointers (#/...) are")
    node = root
    path: list[str | int] = []
    for token in pointer[1:].split("/"):
        key = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and key in node:
            node = node[key]
            path.append(key)
        elif isinstance(node, Sequence) and not isinstance(node, str) and key.isdigit():
            index = int(key)
            if index >= len(node):
                raise SchemaProblem(f"{where} points at nothing")
            node = node[index]
            path.append(index)
        else:
            raise SchemaProblem(f"{where} points at nothing")
    return tuple(path)


def find_cycle(edges: Mapping[Path, Sequence[Path]]) -> list[Path] | None:
    """One cycle of the graph `edges` (its nodes in order), or None; iterative DFS."""
    done: set[Path] = set()
    for start in edges:
        if start in done:
            continue
        on_stack: dict[Path, int] = {start: 0}
        trail: list[Path] = [start]
        pending: list[list[Path]] = [list(edges.get(start, ()))]
        while pending:
            if not pending[-1]:
                finished = trail.pop()
                del on_stack[finished]
                done.add(finished)
                pending.pop()
                continue
            nxt = pending[-1].pop()
            if nxt in on_stack:
                return [*trail[on_stack[nxt] :], nxt]
            if nxt in done:
                continue
            on_stack[nxt] = len(trail)
            trail.append(nxt)
            pending.append(list(edges.get(nxt, ())))
    return None

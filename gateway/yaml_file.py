"""YAML files an operator edits (policies, the models file), validated by a strict pydantic
model, with every error located by line, column and field."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel


@dataclass(frozen=True, slots=True)
class FileIssue:
    line: int | None
    column: int | None
    field: str
    message: str
    path: Path | None = None

    def __str__(self) -> str:
        where = f"line {self.line}, column {self.column}" if self.line else "(no position)"
        return f"{where}: {self.field}: {self.message}"


class YamlFileError(ValueError):
    """A file that cannot be used, with every problem located in its file."""

    def __init__(self, path: Path, issues: list[FileIssue]) -> None:
        self.path = path
        self.issues = issues
        super().__init__("\n".join(f"{issue.path or path}: {issue}" for issue in issues))


@dataclass(frozen=True, slots=True)
class YamlSource:
    """A file's bytes, its parsed mapping and its node tree (for line numbers)."""

    path: Path
    raw: bytes
    data: dict[str, Any]
    root: yaml.Node | None


def read_yaml(path: Path, error: type[YamlFileError]) -> YamlSource:
    """Read a YAML mapping; an unreadable file, bad YAML or a non-mapping raise `error`."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise error(path, [FileIssue(None, None, "(file)", str(exc), path)]) from exc
    text = raw.decode("utf-8", errors="replace")
    try:
        data = yaml.safe_load(text)
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        column = mark.column + 1 if mark else None
        raise error(path, [FileIssue(line, column, "(yaml)", str(exc), path)]) from exc
    if not isinstance(data, dict):
        raise error(path, [FileIssue(1, 1, "(root)", "expected a mapping", path)])
    return YamlSource(path, raw, data, root)


def locate(chain: list[YamlSource], error: Any, model: type[BaseModel]) -> FileIssue:
    """Point at a pydantic error (validating `model`) in the first file of the chain that
    holds that field."""
    loc = tuple(error["loc"])
    message = str(error["msg"])
    if error["type"] == "extra_forbidden":
        message = "unknown key" + _suggestion(model, loc)
    elif error["type"] == "missing":
        message = "required field is missing"
    elif error["type"] == "value_error":  # a validator's own words, without pydantic's prefix
        message = message.removeprefix("Value error, ")
    at_key = error["type"] == "extra_forbidden"
    for source in chain:
        if _node_at(source.root, loc) is not None:
            return issue_at(source, loc, message, at_key)
    return issue_at(chain[0], loc, message, at_key)


def issue_at(
    source: YamlSource, loc: tuple[Any, ...], message: str, at_key: bool = False
) -> FileIssue:
    """Locate `loc` in the file: its value, or its key for an unknown key."""
    field = ".".join(str(p) for p in loc) or "(root)"
    node = (_key_node(source.root, loc) if at_key else None) or _nearest_node(source.root, loc)
    if node is None:
        return FileIssue(None, None, field, message, source.path)
    return FileIssue(
        node.start_mark.line + 1, node.start_mark.column + 1, field, message, source.path
    )


def _suggestion(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    allowed = _fields_at(model, loc[:-1])
    close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
    if close:
        return f"; did you mean '{close[0]}'?"
    return f"; expected one of: {', '.join(allowed)}" if allowed else ""


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        field = current.model_fields.get(str(part))
        if field is None:
            return []
        current = _model_in(field.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _model_in(annotation: Any) -> Any:
    """The BaseModel inside `X`, `list[X]` or `X | None`, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) is not None:
        for arg in get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def _child(node: yaml.Node | None, part: str | int) -> yaml.Node | None:
    # PyYAML types a node's `value` as Any: a mapping holds (key, value) node pairs, a
    # sequence holds nodes.
    if isinstance(node, yaml.MappingNode):
        pairs: list[tuple[yaml.Node, yaml.Node]] = node.value
        for key, value in pairs:
            if key.value == part:
                return value
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
        items: list[yaml.Node] = node.value
        return items[part]
    return None


def _node_at(root: yaml.Node | None, loc: tuple[Any, ...]) -> yaml.Node | None:
    node = root
    for part in loc:
        node = _child(node, part)
        if node is None:
            return None
    return node


def _nearest_node(root: yaml.Node | None, loc: tuple[Any, ...]) -> yaml.Node | None:
    node = root
    for part in loc:
        child = _child(node, part)
        if child is None:
            break
        node = child
    return node


def _key_node(root: yaml.Node | None, loc: tuple[Any, ...]) -> yaml.Node | None:
    """The key of the last path element, so that the error points at the key itself."""
    if not loc or not isinstance(loc[-1], str):
        return None
    parent = _node_at(root, loc[:-1])
    if isinstance(parent, yaml.MappingNode):
        pairs: list[tuple[yaml.Node, yaml.Node]] = parent.value
        for key, _ in pairs:
            if key.value == loc[-1]:
                return key
    return None

"""The gate a client's JSON Schema passes before the engine compiles it.

First the document's size and depth (`document.py`), which bound everything after; then
one walk over every subschema, on an explicit stack, that checks each keyword's value
against Draft 2020-12 (`keyword_values.py`), refuses what the constraint cannot enforce
(`keywords.py`), resolves `$ref` (`refs.py`), counts properties and enum values, and sums
the estimated compile cost (`pattern_cost.py`). Every refusal names the keyword and its
JSON path; each check is linear in the schema's size.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import regex

from gateway.policy.schema import StructuredOutputLimits
from gateway.structured.document import Path, check_document, json_path
from gateway.structured.errors import SchemaProblem, SchemaRefused
from gateway.structured.keyword_values import check_value
from gateway.structured.keywords import (
    ANNOTATIONS,
    DEFINITIONS,
    FORMAT_COSTS,
    NEEDS_TYPE,
    PROPERTY_NAME_KEYWORDS,
    ROOT_ONLY,
    SUPPORTED,
    UNSUPPORTED,
)
from gateway.structured.pattern_cost import PatternRefused, pattern_cost
from gateway.structured.refs import find_cycle, ref_target

SchemaLimits = StructuredOutputLimits

# Compile costs in the units of pattern_cost.py (about 13 µs), measured on SmolLM2.
_NODE_COST = 25  # 1,000 anyOf branches of one property each: 207 ms
_PROPERTY_COST = 30
_RANGE_COST = 300  # a numeric bound becomes a range automaton: 2-4 ms
_COUNT_COSTS = {"maxItems": 250, "maxProperties": 120}  # 256 maxItems: 917 ms
_ENUM_CHAR_COST = 2  # enum and const text: about 16 µs a character

# Beside a keyword that gives the schema's whole meaning ($ref, anyOf, allOf, enum,
# const) the constraint ignores everything else; these change nothing.
_INERT = ANNOTATIONS | ROOT_ONLY | DEFINITIONS
# Where `false` compiles (nothing more may follow); elsewhere it admits no answer.
_FALSE_ALLOWED = frozenset(
    {"additionalProperties", "unevaluatedProperties", "items", "unevaluatedItems"}
)
_ONE_SCHEMA = ("additionalProperties", "unevaluatedProperties", "items", "unevaluatedItems")
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
# All the matches of declared properties against patternProperties keys, together.
_NAME_MATCH_BUDGET_S = 0.1


def check_client_schema(schema: object, limits: SchemaLimits, where: str) -> None:
    """Refuse (SchemaRefused, `param=where`) a schema past the policy's limits, invalid
    under Draft 2020-12, or using what the constraint cannot enforce."""
    try:
        check_document(schema, limits.max_schema_bytes, limits.max_depth)
        if not isinstance(schema, dict):
            raise SchemaProblem("the schema must be a JSON object")
        _Walk(schema, limits).run()
    except SchemaProblem as exc:
        raise SchemaRefused(str(exc), where) from None


@dataclass(slots=True)
class _Walk:
    """One pass over every subschema; what it counts is checked against `limits`."""

    root: dict[str, Any]
    limits: SchemaLimits
    properties: int = 0
    enum_values: int = 0
    cost: int = 0
    costliest: list[tuple[int, str, Path]] = field(default_factory=list)
    # Every subschema's path, and edges from each to those that apply to the same value
    # (`$ref`, anyOf, allOf) or to any value (those and properties, items...).
    schemas: set[Path] = field(default_factory=set)
    same_value: dict[Path, list[Path]] = field(default_factory=dict)
    any_value: dict[Path, list[Path]] = field(default_factory=dict)
    refs: list[tuple[Path, str]] = field(default_factory=list)
    pattern_properties: bool = False
    unevaluated_at: Path | None = None
    match_deadline: float = field(default_factory=lambda: time.monotonic() + _NAME_MATCH_BUDGET_S)

    def run(self) -> None:
        stack: list[tuple[object, Path, bool]] = [(self.root, (), False)]
        while stack:
            node, path, names = stack.pop()
            self.schemas.add(path)
            self.cost += _NODE_COST
            if isinstance(node, bool):
                if not node and (not path or path[-1] not in _FALSE_ALLOWED):
                    raise SchemaProblem(
                        f"the schema false at {json_path(path)} admits no value: leave it out"
                    )
                continue
            if not isinstance(node, dict):  # keyword_values let only schemas through
                raise SchemaProblem(f"the value at {json_path(path)} is not a schema")
            _check_keywords(node, path, names)
            _check_combinations(node, path, names)
            self._check_values(node, path)
            self._check_strings(node, path)
            self._check_numbers(node, path)
            self._check_objects(node, path)
            self._check_counts(node, path)
            if self.cost > self.limits.max_compile_cost:
                self._refuse_cost()
            stack.extend(self._children(node, path))
        self._check_refs()
        if self.unevaluated_at is not None and self.pattern_properties:
            # jsonschema finds unevaluated properties with Python's backtracking `re`
            # over the patternProperties keys, which the answer check cannot bound.
            raise SchemaProblem(
                f"'unevaluatedProperties' at {json_path(self.unevaluated_at)} cannot be used "
                "in a schema with patternProperties; use additionalProperties"
            )
        if self.cost > self.limits.max_compile_cost:
            self._refuse_cost()

    def _refuse_cost(self) -> None:
        parts = sorted(self.costliest, key=lambda part: -part[0])[:3]
        named = ", ".join(f"{what} at {json_path(at)} ({cost})" for cost, what, at in parts)
        raise SchemaProblem(
            f"the schema would take too long to compile (estimated cost over "
            f"{self.limits.max_compile_cost}: structured_output.max_compile_cost); "
            f"the costliest parts: {named or 'its many subschemas'}"
        )

    def _charge(self, cost: int, what: str, path: Path) -> None:
        self.cost += cost
        self.costliest.append((cost, what, path))

    def _check_values(self, node: dict[str, Any], path: Path) -> None:
        """`enum` and `const`: the constraint emits the values as they are, so each must
        be of the schema's `type`, and nothing else may stand beside them."""
        for keyword in ("enum", "const"):
            if keyword not in node:
                continue
            values = node["enum"] if keyword == "enum" else [node["const"]]
            beside = sorted(set(node) - _INERT - {"type", keyword})
            if beside:
                raise SchemaProblem(
                    f"'{beside[0]}' beside '{keyword}' at {json_path(path)} is ignored by "
                    "the constraint: list only the values it allows"
                )
            if not values:
                raise SchemaProblem(f"the empty 'enum' at {json_path(path)} admits no value")
            types = _types(node)
            for value in values:
                if types is not None and not types & _json_types(value):
                    raise SchemaProblem(
                        f"the {keyword} value {json.dumps(value)[:40]} at {json_path(path)} "
                        f"is not of the schema's type {sorted(types)}"
                    )
            if keyword == "enum":
                self.enum_values += len(values)
            if self.enum_values > self.limits.max_enum_values:
                raise SchemaProblem(
                    f"the schema lists more than {self.limits.max_enum_values} enum values "
                    f"(at {json_path(path)}; structured_output.max_enum_values)"
                )
            text = sum(len(json.dumps(value)) for value in values)
            self._charge(text * _ENUM_CHAR_COST, f"'{keyword}'", path)

    def _check_strings(self, node: dict[str, Any], path: Path) -> None:
        shapes: list[str] = [keyword for keyword in ("pattern", "format") if keyword in node]
        if "minLength" in node or "maxLength" in node:
            shapes.append("minLength/maxLength")
        if len(shapes) > 1:
            raise SchemaProblem(
                f"'{shapes[0]}' and '{shapes[1]}' at {json_path(path)} cannot be combined: "
                "the constraint enforces only one of pattern, format and minLength/maxLength"
            )
        if "format" in node:
            fmt = node["format"]
            if fmt not in FORMAT_COSTS:
                raise SchemaProblem(
                    f"'format': {json.dumps(fmt)} at {json_path(path)} is not enforced by the "
                    f"constraint; the formats it enforces: {', '.join(FORMAT_COSTS)}"
                )
            self._charge(FORMAT_COSTS[fmt], f"format '{fmt}'", path)
        if "pattern" in node:
            self._check_pattern(node["pattern"], "'pattern'", path)

    def _check_pattern(self, pattern: str, what: str, path: Path) -> None:
        if len(pattern) > self.limits.max_pattern_length:
            raise SchemaProblem(
                f"{what} at {json_path(path)} is longer than {self.limits.max_pattern_length} "
                "characters (structured_output.max_pattern_length)"
            )
        try:
            regex.compile(pattern)  # the answer check matches with it
        except regex.error as exc:
            raise SchemaProblem(
                f"{what} at {json_path(path)} is not a valid regular expression: {exc}"
            ) from None
        try:
            cost = pattern_cost(pattern, self.limits.max_compile_cost)
        except PatternRefused as exc:
            raise SchemaProblem(f"{what} at {json_path(path)} is not supported: {exc}") from None
        if cost > self.limits.max_compile_cost:
            raise SchemaProblem(
                f"{what} at {json_path(path)} would take too long to compile (estimated cost "
                f"over {self.limits.max_compile_cost}: structured_output.max_compile_cost): "
                "use fewer or smaller counted repetitions, or minLength/maxLength"
            )
        self._charge(cost, what, path)

    def _check_numbers(self, node: dict[str, Any], path: Path) -> None:
        types = _types(node) or set()
        present = [keyword for keyword in _BOUNDS if keyword in node]
        for keyword in present:
            if "integer" in types and not float(node[keyword]).is_integer():
                raise SchemaProblem(
                    f"'{keyword}' at {json_path(path)} must be a whole number for an integer"
                )
        if present:
            self._charge(_RANGE_COST, "a numeric range", path)
        step = node.get("multipleOf")
        if step is not None and ("number" in types or not float(step).is_integer()):
            raise SchemaProblem(
                f"'multipleOf' at {json_path(path)} is enforced only for "
                '"type": "integer" with a whole step'
            )

    def _check_objects(self, node: dict[str, Any], path: Path) -> None:
        declared: dict[str, Any] = node.get("properties", {})
        for name in node.get("required", ()):
            if name not in declared:
                raise SchemaProblem(
                    f"'required' at {json_path(path)} names {json.dumps(name)}, which is not "
                    "in its 'properties': the constraint requires only declared properties"
                )
        patterns: dict[str, Any] = node.get("patternProperties", {})
        self.properties += len(declared) + len(patterns)
        if self.properties > self.limits.max_properties:
            raise SchemaProblem(
                f"the schema declares more than {self.limits.max_properties} properties "
                f"(at {json_path(path)}; structured_output.max_properties)"
            )
        self.cost += _PROPERTY_COST * (len(declared) + len(patterns))
        self.pattern_properties = self.pattern_properties or bool(patterns)
        if "unevaluatedProperties" in node:
            self.unevaluated_at = path
        for pattern in patterns:
            what = f"the patternProperties key {json.dumps(pattern)[:60]}"
            self._check_pattern(pattern, what, path)
            for name in declared:
                if self._matches(pattern, name, what, path):
                    raise SchemaProblem(
                        f"property {json.dumps(name)} at {json_path(path)} also matches {what}: "
                        "the constraint applies only its 'properties' schema"
                    )

    def _matches(self, pattern: str, name: str, what: str, path: Path) -> bool:
        """jsonschema's reading of a pattern (a search), within the walk's time budget."""
        remaining = self.match_deadline - time.monotonic()
        try:
            if remaining > 0:
                return regex.search(pattern, name, timeout=remaining) is not None
        except TimeoutError:
            pass
        raise SchemaProblem(
            f"{what} at {json_path(path)} takes too long to match the declared property "
            f"names (more than {_NAME_MATCH_BUDGET_S:g} s in all): simplify it"
        )

    def _check_counts(self, node: dict[str, Any], path: Path) -> None:
        for keyword, cost in _COUNT_COSTS.items():
            if keyword in node:
                self._charge(cost, f"'{keyword}'", path)
        for keyword in ("minLength", "minItems", "minProperties"):
            if node.get(keyword, 0) > self.limits.max_required_count:
                raise SchemaProblem(
                    f"'{keyword}' at {json_path(path)} is above "
                    f"{self.limits.max_required_count} (structured_output.max_required_count): "
                    "an answer could not finish"
                )

    def _children(self, node: dict[str, Any], path: Path) -> list[tuple[object, Path, bool]]:
        """The subschemas of `node` to walk; records which apply to the same value."""
        same = [
            (branch, (*path, keyword, index), False)
            for keyword in ("anyOf", "allOf")
            for index, branch in enumerate(node.get(keyword, ()))
        ]
        part = [
            (value, (*path, keyword, name), False)
            for keyword in ("properties", "patternProperties")
            for name, value in node.get(keyword, {}).items()
        ]
        part += [
            (item, (*path, "prefixItems", i), False)
            for i, item in enumerate(node.get("prefixItems", ()))
        ]
        part += [(node[k], (*path, k), False) for k in _ONE_SCHEMA if k in node]
        if "propertyNames" in node:
            part.append((node["propertyNames"], (*path, "propertyNames"), True))
        definitions = [
            (value, (*path, keyword, name), False)
            for keyword in DEFINITIONS
            for name, value in node.get(keyword, {}).items()
        ]
        if "$ref" in node:
            self.refs.append((path, node["$ref"]))
        self.same_value[path] = [child for _, child, _ in same]
        self.any_value[path] = [child for _, child, _ in same + part]
        return same + part + definitions

    def _check_refs(self) -> None:
        for path, ref in self.refs:
            target = ref_target(self.root, ref, path)
            if target not in self.schemas:
                raise SchemaProblem(
                    f"'$ref' {ref!r} at {json_path(path)} does not point at a schema"
                )
            self.same_value[path].append(target)
            self.any_value[path].append(target)
        cycle = find_cycle(self.same_value)
        if cycle is not None:
            raise SchemaProblem(
                f"the '$ref' cycle {' -> '.join(json_path(p) for p in cycle)} never reaches "
                "a property or an item, so it matches no value"
            )
        cycle = find_cycle(self.any_value)
        if cycle is not None and not self.limits.allow_recursive_refs:
            raise SchemaProblem(
                f"the schema is recursive ({' -> '.join(json_path(p) for p in cycle)}); "
                "recursive schemas are off in this policy "
                "(structured_output.allow_recursive_refs)"
            )


def _check_keywords(node: Mapping[str, Any], path: Path, names: bool) -> None:
    """Every keyword must be one the constraint enforces, in a place where it does, with
    a value Draft 2020-12 allows."""
    for keyword, value in node.items():
        if keyword in UNSUPPORTED:
            raise SchemaProblem(
                f"'{keyword}' at {json_path(path)} is not supported: {UNSUPPORTED[keyword]}"
            )
        if keyword not in SUPPORTED:
            raise SchemaProblem(
                f"'{keyword}' at {json_path(path)} is not a keyword the constraint enforces "
                "(unknown keywords are refused, not ignored)"
            )
        if keyword in ROOT_ONLY and path:
            raise SchemaProblem(
                f"'{keyword}' at {json_path(path)} is allowed only at the schema's root"
            )
        if names and keyword not in PROPERTY_NAME_KEYWORDS:
            raise SchemaProblem(
                f"'{keyword}' at {json_path(path)} is not enforced on property names; use "
                "pattern, minLength/maxLength, format, enum or const there"
            )
        check_value(keyword, value, path)


def _check_combinations(node: Mapping[str, Any], path: Path, names: bool) -> None:
    """Keywords the constraint enforces only alone, or only with their `type`."""
    for keyword in ("$ref", "anyOf", "allOf"):
        beside = sorted(set(node) - _INERT - {keyword})
        if keyword in node and beside:
            raise SchemaProblem(
                f"'{beside[0]}' beside '{keyword}' at {json_path(path)} is ignored by the "
                f"constraint: move it into the schema '{keyword}' names"
            )
    if len(node.get("allOf", ())) > 1:
        raise SchemaProblem(
            f"'allOf' at {json_path(path)} with more than one schema is not enforced by the "
            "constraint: merge them into one"
        )
    types = _types(node)
    for keyword in sorted(NEEDS_TYPE.keys() & node.keys()):
        needed = NEEDS_TYPE[keyword]
        if not names and (types is None or not types & set(needed)):
            raise SchemaProblem(
                f'\'{keyword}\' at {json_path(path)} needs "type": "{needed[0]}" in the same '
                "schema: without it the constraint ignores it"
            )


def _types(node: Mapping[str, Any]) -> set[str] | None:
    declared = node.get("type")
    if declared is None:
        return None
    return {declared} if isinstance(declared, str) else set(declared)


def _json_types(value: object) -> set[str]:
    """The JSON Schema types `value` is an instance of."""
    if value is None:
        return {"null"}
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"number"}
    if isinstance(value, str):
        return {"string"}
    return {"array"} if isinstance(value, list) else {"object"}

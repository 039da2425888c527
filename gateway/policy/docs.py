"""docs/policies.md: a field-by-field reference generated from the policy schema."""

from __future__ import annotations

import json
from typing import Any

from gateway.policy.schema import policy_json_schema

_HEADER = """# Policy reference

Policies are YAML files in the policy folder (`BASTION_POLICY_DIR`, default `policies/`).
Each file is one policy; `applies_to` binds it to tenants or to single API keys (a key's
own binding wins over its tenant's). A caller with no bound policy is refused (fail closed).
A policy can `extends:` another by name and then overrides only the fields it names.

Edited files are picked up while the service runs: a valid file is swapped in at once; an
invalid one is reported (log, `GET /admin/policies`, audit event `policy.reload_failed`)
and the last good version stays active. Every audit record carries the version (SHA-256)
of the policy that judged it.

Tools: `bastion policy check FILE...` validates; `bastion policy schema -o FILE` writes the
JSON Schema (point your editor's YAML plugin at it); `bastion policy test FILE --cases
CASES.yaml` runs example requests through the real guardrails (see
`policies/tests/default.cases.yaml`). Regenerate this page with
`bastion policy docs -o docs/policies.md`.

Check modes: `enforce` acts on the verdict, `warn` records it only, `dryrun` records what
it would have done.

"""

_EXAMPLE = """
## Worked example

A stricter policy for the `legal` tenant, built on the default one:

```yaml
# policies/legal.yaml
name: legal
extends: default
description: Legal team; no tools, nothing stored in clear, tight budgets.
applies_to:
  tenants: [legal]
input:
  injection:
    extra_patterns: ["\\\\bact as (my|our) lawyer\\\\b"]
  topics:
    enabled: true
    allowed:
      - name: contracts
        description: Questions about contracts, clauses and agreements.
        examples: ["What does the indemnity clause cover?"]
retrieval:
  collections: [contracts]
  top_k: 5
model:
  max_tokens: 256
  max_temperature: 0.7
  allow_tools: false
audit:
  store_content: false
rate_limits:
  key_requests_per_minute: 30
  tenant_tokens_per_minute: 200000
```

`bastion policy check policies/legal.yaml` then reports, for a typo such as `top_kk`:

```
policies/legal.yaml: line 18, column 3: retrieval.top_kk: unknown key; did you mean 'top_k'?
```
"""


def render_policy_reference() -> str:
    schema = policy_json_schema()
    defs: dict[str, Any] = schema.get("$defs", {})
    lines = [_HEADER, "## Fields\n"]
    lines.append("| field | type | default | description |")
    lines.append("| --- | --- | --- | --- |")
    _rows(schema, defs, "", lines)
    return "\n".join(lines) + "\n" + _EXAMPLE


def _rows(node: dict[str, Any], defs: dict[str, Any], prefix: str, lines: list[str]) -> None:
    required = set(node.get("required", []))
    for name, prop in node.get("properties", {}).items():
        path = f"{prefix}{name}"
        target = _resolve(prop, defs)
        default = "required" if name in required else _default(prop)
        description = prop.get("description") or target.get("description") or ""
        description = " ".join(description.split()).replace("|", "\\|")
        lines.append(f"| `{path}` | {_type(prop, defs)} | {default} | {description} |")
        if target.get("type") == "object" and "properties" in target:
            _rows(target, defs, f"{path}.", lines)
        items = target.get("items")
        if target.get("type") == "array" and isinstance(items, dict):
            item = _resolve(items, defs)
            if "properties" in item:
                _rows(item, defs, f"{path}[].", lines)


def _resolve(prop: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in prop:
        return dict(defs[prop["$ref"].split("/")[-1]])
    for option in prop.get("anyOf", []):
        if "$ref" in option:
            return dict(defs[option["$ref"].split("/")[-1]])
    return prop


def _type(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    if "enum" in prop:
        return " \\| ".join(f"`{v}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{prop['const']}`"
    if "$ref" in prop:
        target = defs[prop["$ref"].split("/")[-1]]
        return "mapping" if target.get("type") == "object" else _type(target, defs)
    if "anyOf" in prop:
        return " or ".join(_type(option, defs) for option in prop["anyOf"])
    kind = str(prop.get("type", "any"))
    if kind == "array":
        return f"list of {_type(prop.get('items', {}), defs)}"
    return {"object": "mapping", "null": "null"}.get(kind, kind)


def _default(prop: dict[str, Any]) -> str:
    if "default" not in prop:
        return ""
    value = prop["default"]
    if value is None or isinstance(value, bool):
        return f"`{json.dumps(value)}`"
    if isinstance(value, dict):
        return "(see below)" if value else "`{}`"
    text = str(value).replace("|", "\\|").replace("\n", " ")
    if len(text) > 40:
        text = text[:37] + "..."
    return f"`{text}`"

"""deploy/inference-gateway/: the InferencePool and HTTPRoute that put the replicas behind
an inference gateway (the Gateway API Inference Extension).

They are custom resources, so `kubernetes-validate` has no schema for them. Their fields
are checked against schemas written here from the published CRDs (InferencePool v1 of the
extension's v1.x releases; of Gateway API's HTTPRoute v1, the fields used here), with the
CRDs' CEL rules as code; and they must point at what deploy/ really runs.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
import yaml

from gateway.http.metrics import metrics_endpoint
from gateway.settings import REPO_ROOT

FOLDER = REPO_ROOT / "deploy" / "inference-gateway"
POOL_GROUP = "inference.networking.k8s.io"

_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
_PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "maxLength": 253, "pattern": _DNS_SUBDOMAIN},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "additionalProperties": False,
}

INFERENCE_POOL = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": f"{POOL_GROUP}/v1"},
        "kind": {"const": "InferencePool"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "required": ["selector", "targetPorts"],
            "additionalProperties": False,
            "properties": {
                "appProtocol": {"enum": ["http", "kubernetes.io/h2c"]},
                "selector": {
                    "type": "object",
                    "required": ["matchLabels"],
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": {
                            "type": "object",
                            "minProperties": 1,
                            "maxProperties": 64,
                            "additionalProperties": {
                                "type": "string",
                                "maxLength": 63,
                                "pattern": _LABEL_VALUE,
                            },
                        }
                    },
                },
                "targetPorts": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 8,
                    "items": {
                        "type": "object",
                        "required": ["number"],
                        "additionalProperties": False,
                        "properties": {"number": _PORT},
                    },
                },
                "endpointPickerRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        "group": {"type": "string", "maxLength": 253},
                        "kind": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": 63,
                            "pattern": r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$",
                        },
                        "name": {"type": "string", "minLength": 1, "maxLength": 253},
                        "port": {
                            "type": "object",
                            "required": ["number"],
                            "additionalProperties": False,
                            "properties": {"number": _PORT},
                        },
                        "failureMode": {"enum": ["FailOpen", "FailClose"]},
                    },
                },
            },
        },
    },
}

_PARENT_REF = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "group": {"type": "string"},
        "kind": {"type": "string"},
        "name": {"type": "string", "minLength": 1, "maxLength": 253},
        "namespace": {"type": "string"},
        "sectionName": {"type": "string"},
        "port": _PORT,
    },
}
_BACKEND_REF = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "group": {"type": "string", "maxLength": 253},
        "kind": {"type": "string", "minLength": 1, "maxLength": 63},
        "name": {"type": "string", "minLength": 1, "maxLength": 253},
        "namespace": {"type": "string"},
        "port": _PORT,
        "weight": {"type": "integer", "minimum": 0, "maximum": 1000000},
    },
}
_PATH_MATCH = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "path": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "type": {"enum": ["Exact", "PathPrefix", "RegularExpression"]},
                "value": {"type": "string", "pattern": "^/", "maxLength": 1024},
            },
        }
    },
}
HTTP_ROUTE = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "gateway.networking.k8s.io/v1"},
        "kind": {"const": "HTTPRoute"},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "parentRefs": {"type": "array", "maxItems": 32, "items": _PARENT_REF},
                "hostnames": {"type": "array", "items": {"type": "string"}},
                "rules": {
                    "type": "array",
                    "maxItems": 16,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "matches": {"type": "array", "maxItems": 64, "items": _PATH_MATCH},
                            "backendRefs": {
                                "type": "array",
                                "maxItems": 16,
                                "items": _BACKEND_REF,
                            },
                        },
                    },
                },
            },
        },
    },
}
SCHEMAS = {"InferencePool": INFERENCE_POOL, "HTTPRoute": HTTP_ROUTE}


def documents() -> dict[str, dict[str, Any]]:
    found = {
        doc["kind"]: doc
        for path in sorted(FOLDER.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8"))
        if doc
    }
    assert set(found) == set(SCHEMAS), found.keys()
    return found


def deployment() -> dict[str, Any]:
    doc = yaml.safe_load((REPO_ROOT / "deploy" / "deployment.yaml").read_text(encoding="utf-8"))
    assert doc["kind"] == "Deployment"
    return dict(doc)


def pool_rules_broken(pool: dict[str, Any]) -> list[str]:
    """The InferencePool CRD's CEL rules, which no JSON Schema can say."""
    broken = []
    ref = pool["spec"].get("endpointPickerRef")
    if ref is not None and ref.get("kind", "Service") == "Service" and "port" not in ref:
        broken.append("port is required when kind is 'Service' or unspecified")
    numbers = [p["number"] for p in pool["spec"]["targetPorts"]]
    if len(numbers) != len(set(numbers)):
        broken.append("port number must be unique")
    return broken


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_each_resource_has_only_known_fields_of_the_right_types(kind: str) -> None:
    jsonschema.validate(documents()[kind], SCHEMAS[kind])


def test_the_schemas_refuse_what_the_crds_refuse() -> None:
    """The checks can fail: a misspelt field, a port out of range, a bad failure mode."""
    pool = documents()["InferencePool"]
    broken = [
        {**pool, "spec": {**pool["spec"], "targetPortNumber": 8000}},  # the pre-v1 field
        {**pool, "spec": {**pool["spec"], "targetPorts": [{"number": 70000}]}},
        {
            **pool,
            "spec": {**pool["spec"], "endpointPickerRef": {"name": "x", "failureMode": "Open"}},
        },
    ]
    for doc in broken:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(doc, INFERENCE_POOL)
    no_port = {**pool, "spec": {**pool["spec"], "endpointPickerRef": {"name": "bastion-epp"}}}
    assert pool_rules_broken(no_port)
    twice = {**pool, "spec": {**pool["spec"], "targetPorts": [{"number": 1}, {"number": 1}]}}
    assert pool_rules_broken(twice)


def test_the_pool_keeps_the_crd_rules() -> None:
    assert pool_rules_broken(documents()["InferencePool"]) == []


def test_the_pool_selects_the_replicas_on_the_port_that_serves_the_metrics() -> None:
    pool = documents()["InferencePool"]["spec"]
    template = deployment()["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert pool["selector"]["matchLabels"].items() <= labels.items()
    (container,) = template["spec"]["containers"]
    ports = {p["containerPort"] for p in container["ports"]}
    assert {p["number"] for p in pool["targetPorts"]} <= ports
    # The endpoint picker scrapes `/metrics` on the target port; `bastion serve` has it.
    assert "/metrics" in metrics_endpoint.paths
    port_arg = container["args"][container["args"].index("--port") + 1]
    assert [p["number"] for p in pool["targetPorts"]] == [int(port_arg)]


def test_the_route_sends_the_openai_api_to_the_pool() -> None:
    docs = documents()
    route, pool = docs["HTTPRoute"]["spec"], docs["InferencePool"]
    (rule,) = route["rules"]
    assert {"path": {"type": "PathPrefix", "value": "/v1"}} in rule["matches"]
    assert rule["backendRefs"] == [
        {"group": POOL_GROUP, "kind": "InferencePool", "name": pool["metadata"]["name"]}
    ]

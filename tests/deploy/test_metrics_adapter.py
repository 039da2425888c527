"""deploy/metrics-adapter/values.yaml: the prometheus-adapter rules that serve the HPAs'
pods metrics, each reading a series and label that Bastion's /metrics exports."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
import yaml

from engine import EngineMetrics
from gateway.http.metrics import GatewayMetrics
from gateway.settings import REPO_ROOT

DEPLOY = REPO_ROOT / "deploy"
HPAS = (DEPLOY / "hpa.yaml", DEPLOY / "upstream" / "hpa-patch.yaml")
# A series query: a metric name, optionally with label matchers such as {field="waiting"}.
SERIES = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?$")
MATCHER = re.compile(r'(?P<label>\w+)="(?P<value>[^"]*)"')


def rules() -> list[dict[str, Any]]:
    values = yaml.safe_load((DEPLOY / "metrics-adapter" / "values.yaml").read_text("utf-8"))
    assert values["rules"]["default"] is False, "only Bastion's rules, no adapter defaults"
    return list(values["rules"]["custom"])


def hpa_metric(path: Any) -> str:
    (metric,) = yaml.safe_load(path.read_text(encoding="utf-8"))["spec"]["metrics"]
    assert metric["type"] == "Pods"
    return str(metric["pods"]["metric"]["name"])


@pytest.mark.parametrize("hpa", HPAS, ids=[p.name for p in HPAS])
def test_each_hpas_metric_has_one_rule(hpa: Any) -> None:
    served = [rule["name"]["as"] for rule in rules()]
    assert served.count(hpa_metric(hpa)) == 1


@pytest.mark.parametrize("rule", rules(), ids=[r["name"]["as"] for r in rules()])
def test_each_rule_reads_a_series_bastion_exports(rule: dict[str, Any]) -> None:
    found = SERIES.match(rule["seriesQuery"])
    assert found, rule["seriesQuery"]
    name = found["name"]
    families = {family.name: family for family in GatewayMetrics().registry.collect()}
    assert name in families, f"/metrics exports no {name}"
    matchers = dict(MATCHER.findall(found["labels"] or ""))
    if name == "bastion_engine":
        # bastion_engine{field=...} carries each numeric field of the engine's snapshot.
        assert set(matchers) == {"field"}
        assert matchers["field"] in {field.name for field in dataclasses.fields(EngineMetrics)}
    else:
        assert not matchers
    # The query the adapter runs reads the same series, per pod.
    query = rule["metricsQuery"]
    assert f"{name}{{" in query and "<<.LabelMatchers>>" in query
    for label, value in matchers.items():
        assert f'{label}="{value}"' in query
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}

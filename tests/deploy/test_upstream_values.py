"""deploy/upstream/: the base manifests in front of upstream servers. The overlay is
rendered here as kustomize would (the patch merged over the base Deployment, lists of
named items merged by name), then validated like the base."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gateway.cli import main
from gateway.http.metrics import GatewayMetrics
from gateway.settings import Settings
from tests.deploy.test_manifests import DEPLOY, VERSIONS

UPSTREAM = DEPLOY / "upstream"


def load(path: Path) -> dict[str, Any]:
    return dict(yaml.safe_load(path.read_text(encoding="utf-8")))


def merge(base: Any, patch: Any) -> Any:
    """A strategic merge as kustomize does it for these fields: maps key by key, lists of
    maps with a `name` item by item, anything else replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and all("name" in i for i in patch):
        by_name = {item["name"]: item for item in patch}
        merged_list = [merge(item, by_name.pop(item["name"], {})) for item in base]
        return merged_list + [copy.deepcopy(item) for item in by_name.values()]
    return copy.deepcopy(patch)


def rendered(kind: str) -> dict[str, Any]:
    """The base manifest of `kind` with the overlay's patch of that kind merged over it."""
    (base,) = [d for path in DEPLOY.glob("*.yaml") if (d := load(path)).get("kind") == kind]
    patches = [load(UPSTREAM / p["path"]) for p in load(UPSTREAM / "kustomization.yaml")["patches"]]
    (patch,) = [p for p in patches if p["kind"] == kind]
    assert patch["metadata"]["name"] == base["metadata"]["name"]
    return dict(merge(base, patch))


def rendered_deployment() -> dict[str, Any]:
    return rendered("Deployment")


def container() -> dict[str, Any]:
    (only,) = rendered_deployment()["spec"]["template"]["spec"]["containers"]
    return dict(only)


def models_file_text() -> str:
    return str(load(UPSTREAM / "configmap-models.yaml")["data"]["models.yaml"])


def test_every_resource_the_overlays_name_is_there() -> None:
    for folder in (DEPLOY, UPSTREAM):
        for resource in load(folder / "kustomization.yaml")["resources"]:
            assert (folder / resource).exists(), resource
    listed = set(load(DEPLOY / "kustomization.yaml")["resources"])
    assert listed == {p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml"}


@pytest.mark.parametrize("version", VERSIONS)
def test_the_rendered_deployment_and_config_map_are_valid(version: str) -> None:
    kubernetes_validate.validate(rendered_deployment(), version, strict=True)
    kubernetes_validate.validate(rendered("HorizontalPodAutoscaler"), version, strict=True)
    kubernetes_validate.validate(load(UPSTREAM / "configmap-models.yaml"), version, strict=True)


def test_the_models_file_passes_the_models_check(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(models_file_text(), encoding="utf-8")
    assert main(["models", "check", str(path)]) == 0
    assert yaml.safe_load(models_file_text())["embedded"] is False


def test_the_container_reads_the_mounted_models_file_and_the_keys_it_names() -> None:
    env = {e["name"]: e for e in container()["env"]}
    models_path = Path(env["BASTION_MODELS_FILE"]["value"])
    mounts = {m["name"]: m["mountPath"] for m in container()["volumeMounts"]}
    assert str(models_path.parent) == mounts["models"]
    volumes = {v["name"]: v for v in rendered_deployment()["spec"]["template"]["spec"]["volumes"]}
    assert volumes["models"]["configMap"]["name"] == "bastion-models"
    assert models_path.name in load(UPSTREAM / "configmap-models.yaml")["data"]
    # The base's settings are all still there, beside the models file.
    assert {"BASTION_DATABASE_URL", "BASTION_POLICY_DIR", "BASTION_DRAIN_SECONDS"} <= set(env)
    known = {f"BASTION_{field.upper()}" for field in Settings.model_fields}
    keys = {m["upstream"].get("api_key_env") for m in yaml.safe_load(models_file_text())["models"]}
    assert set(env) <= known | keys
    for key in keys - {None}:
        assert "secretKeyRef" in env[key]["valueFrom"], f"{key} comes from a Secret"


def test_a_replica_without_the_embedded_engine_asks_for_less_memory() -> None:
    base = load(DEPLOY / "deployment.yaml")["spec"]["template"]["spec"]["containers"][0]

    def mib(quantity: str) -> int:
        return (
            int(quantity.removesuffix("Gi")) * 1024
            if quantity.endswith("Gi")
            else int(quantity.removesuffix("Mi"))
        )

    assert mib(container()["resources"]["requests"]["memory"]) < mib(
        base["resources"]["requests"]["memory"]
    )


def test_without_an_engine_queue_the_replicas_scale_on_the_requests_in_flight() -> None:
    hpa = rendered("HorizontalPodAutoscaler")
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    name = metric["pods"]["metric"]["name"]
    assert name == "bastion_requests_in_flight"
    assert name in {family.name for family in GatewayMetrics().registry.collect()}
    target = metric["pods"]["target"]
    assert target["type"] == "AverageValue" and int(target["averageValue"]) > 0
    # The base's bounds and behaviour are kept; only what it scales on changes.
    base = load(DEPLOY / "hpa.yaml")["spec"]
    assert hpa["spec"]["scaleTargetRef"] == base["scaleTargetRef"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (
        base["minReplicas"],
        base["maxReplicas"],
    )
    assert hpa["spec"]["behavior"] == base["behavior"]

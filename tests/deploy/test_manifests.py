"""The Kubernetes manifests in deploy/: valid against the Kubernetes schemas (offline,
`kubernetes-validate`), wired to what the service really reads and serves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gateway.cli import main
from gateway.http.draining_server import CUT_OFF_SECONDS
from gateway.http.probes import healthz, readyz
from gateway.settings import REPO_ROOT, Settings

DEPLOY = REPO_ROOT / "deploy"
# The oldest Kubernetes release these manifests are meant for, and the newest known.
VERSIONS = ("1.30.0", kubernetes_validate.latest_version())


def documents() -> list[tuple[str, dict[str, Any]]]:
    found = [
        (f"{path.name}#{i}", doc)
        for path in sorted(DEPLOY.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for i, doc in enumerate(yaml.safe_load_all(path.read_text(encoding="utf-8")))
        if doc
    ]
    assert found, "no manifests in deploy/"
    return found


def kind(name: str) -> dict[str, Any]:
    (doc,) = [d for _, d in documents() if d["kind"] == name]
    return doc


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("name", "doc"), documents(), ids=[n for n, _ in documents()])
def test_each_manifest_is_valid_and_has_no_unknown_field(
    name: str, doc: dict[str, Any], version: str
) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


def test_every_kind_a_deployment_needs_is_there() -> None:
    kinds = {d["kind"] for _, d in documents()}
    assert kinds >= {
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "ConfigMap",
    }


def test_the_container_reads_real_settings_and_probes_real_routes() -> None:
    (container,) = kind("Deployment")["spec"]["template"]["spec"]["containers"]
    known = {f"BASTION_{field.upper()}" for field in Settings.model_fields}
    assert {e["name"] for e in container["env"]} <= known
    assert container["startupProbe"]["httpGet"]["path"] in readyz.paths
    assert container["readinessProbe"]["httpGet"]["path"] in readyz.paths
    assert container["livenessProbe"]["httpGet"]["path"] in healthz.paths
    secrets = {e["name"] for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})}
    assert secrets == {"BASTION_DATABASE_URL", "BASTION_REDIS_URL", "BASTION_AUDIT_SIGNING_KEY"}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["BASTION_POLICY_DIR"] in mounts and env["BASTION_DATA_DIR"] in mounts


def test_the_policies_in_the_config_map_pass_the_policy_check(tmp_path: Path) -> None:
    files = []
    for filename, text in kind("ConfigMap")["data"].items():
        path = tmp_path / filename
        path.write_text(text)
        files.append(str(path))
    assert main(["policy", "check", *files]) == 0


def test_the_kubelet_waits_longer_than_a_drain() -> None:
    """SIGKILL after the grace period must not cut the drain short (gateway/http/drain.py)."""
    spec = kind("Deployment")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    drain = Settings(drain_seconds=env["BASTION_DRAIN_SECONDS"]).drain_seconds
    assert drain + 2 * CUT_OFF_SECONDS < spec["terminationGracePeriodSeconds"]


def test_the_service_budget_and_autoscaler_select_the_deployments_pods() -> None:
    """Labels are free text: a typo leaves a Service without endpoints, a budget that
    protects nothing, an autoscaler aimed at nothing, and every schema still passes."""
    deployment = kind("Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = kind("Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (port,) = service["spec"]["ports"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert port["targetPort"] in {p["name"] for p in container["ports"]}
    budget = kind("PodDisruptionBudget")["spec"]
    assert budget["selector"]["matchLabels"].items() <= pod_labels.items()
    assert budget["minAvailable"] < deployment["spec"]["replicas"]
    target = kind("HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()

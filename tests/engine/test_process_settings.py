"""Triton (installed as xgrammar's dependency, for GPUs) stays out of a process with no
CUDA device, however the process comes to import transformers; oneDNN's primitive cache is
bounded unless the operator set it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from gateway.settings import REPO_ROOT

# What `bastion serve` imports, then what would load Triton: torch._dynamo and transformers.
SERVE_IMPORTS = """
import sys
import gateway.cli, gateway.app
import torch._dynamo, transformers
from transformers import AutoModel
print(sys.modules.get("triton") is None)
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device may use Triton")
def test_the_server_process_never_loads_triton() -> None:
    installed = subprocess.run(
        [sys.executable, "-c", "import importlib.util; print(importlib.util.find_spec('triton'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    # Installed, so it would be loaded if nothing kept it out.
    assert installed.stdout.strip() != "None"
    loaded = subprocess.run(
        [sys.executable, "-c", SERVE_IMPORTS],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.strip() == "True"


@pytest.mark.parametrize(("preset", "expected"), [(None, "64"), ("512", "512")])
def test_bastion_bounds_onednns_primitive_cache_unless_the_operator_did(
    preset: str | None, expected: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    if preset is not None:
        env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = preset
    code = (
        "import os, sys; import gateway.cli; "
        "assert 'torch' in sys.modules; print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'])"
    )
    ran = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.strip() == expected

"""Triton (installed as xgrammar's dependency, for GPUs) stays out of a process with no
CUDA device, however the process comes to import transformers."""

from __future__ import annotations

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

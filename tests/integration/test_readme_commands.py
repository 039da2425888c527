"""The README's serve command, run exactly as written, gives a working service."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from openai import OpenAI

from gateway.settings import REPO_ROOT
from tests.support.local_server import free_port, wait_until_ready


def readme_commands() -> list[str]:
    text = (REPO_ROOT / "README.md").read_text()
    section = text.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.+?)\n```", section)


def test_readme_names_the_two_commands() -> None:
    assert readme_commands() == ["make serve", "make test"]
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert "make test" in ci


@pytest.mark.slow
def test_serve_command_starts_a_usable_service(tmp_path: Path) -> None:
    port = free_port()
    env = os.environ | {"BASTION_DATA_DIR": str(tmp_path / "data"), "BASTION_PORT": str(port)}
    process = subprocess.Popen(
        readme_commands()[0].split(),
        cwd=REPO_ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        assert process.stdout is not None
        key = url = None
        deadline = time.monotonic() + 600  # a fresh venv install may happen first
        while (key is None or url is None) and time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line and process.poll() is not None:
                pytest.fail(f"serve exited with {process.returncode}")
            if found := re.search(r"API key for tenant 'default': (bst_\S+)", line):
                key = found.group(1)
            if found := re.search(r"starting on (http://\S+)", line):
                url = found.group(1)
        assert key and url == f"http://127.0.0.1:{port}"
        wait_until_ready(url, deadline - time.monotonic(), process)
        client = OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)
        answer = client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            max_tokens=16,
            temperature=0,
            messages=[{"role": "user", "content": "How do I set up the VPN client?"}],
        )
        assert answer.choices[0].message.content
        citations = (answer.model_extra or {})["citations"]
        best = max(citations, key=lambda c: c["score"])
        assert best["source"].endswith("vpn-setup.md")
        assert (tmp_path / "data" / "default-api-key.txt").read_text().strip() == key
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)

"""Hot reload and binding: valid edits swap in, invalid ones keep the last good policy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.keys.store import KeyIdentity
from gateway.policy.registry import NoPolicyError, PolicyChange, PolicyRegistry
from gateway.policy.schema import LoadedPolicy
from tests.support.configmap_volume import ConfigMapVolume

ALICE = KeyIdentity("key-alice", "acme", "user")


def write(path: Path, text: str | bytes) -> None:
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    stat = path.stat()  # make sure the change is visible even within one mtime tick
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    write(
        tmp_path / "acme.yaml",
        "name: acme\napplies_to:\n  tenants: [acme]\nmodel:\n  max_tokens: 100\n",
    )
    return tmp_path


def registry(folder: Path, changes: list[PolicyChange]) -> PolicyRegistry[LoadedPolicy]:
    reg: PolicyRegistry[LoadedPolicy] = PolicyRegistry(folder, lambda p: p, changes.append)
    reg.reload(actor="test")
    return reg


def test_tenant_binding_and_fail_closed(folder: Path) -> None:
    reg = registry(folder, [])
    assert reg.for_identity(ALICE).policy.name == "acme"
    with pytest.raises(NoPolicyError, match="tenant 'globex'"):
        reg.for_identity(KeyIdentity("key-bob", "globex", "user"))


def test_key_binding_wins_over_tenant_binding(folder: Path) -> None:
    write(folder / "strict.yaml", "name: strict\napplies_to:\n  keys: [key-alice]\n")
    reg = registry(folder, [])
    assert reg.for_identity(ALICE).policy.name == "strict"
    assert reg.for_identity(KeyIdentity("key-carol", "acme", "user")).policy.name == "acme"


def test_a_valid_edit_swaps_in_and_is_reported(folder: Path) -> None:
    changes: list[PolicyChange] = []
    reg = registry(folder, changes)
    old = reg.for_identity(ALICE).version
    write(
        folder / "acme.yaml",
        "name: acme\napplies_to:\n  tenants: [acme]\nmodel:\n  max_tokens: 42\n",
    )
    assert reg.reload() and reg.for_identity(ALICE).policy.model.max_tokens == 42
    assert changes[-1].old_version == old
    assert changes[-1].new_version == reg.for_identity(ALICE).version != old
    assert reg.reload() == []  # nothing changed since


def test_an_invalid_edit_keeps_the_last_good_policy(folder: Path) -> None:
    changes: list[PolicyChange] = []
    reg = registry(folder, changes)
    good = reg.for_identity(ALICE)
    write(
        folder / "acme.yaml", "name: acme\napplies_to:\n  tenants: [acme]\nmodel:\n  max_tokns: 1\n"
    )
    reg.reload()
    assert reg.for_identity(ALICE) is good
    assert changes[-1].error is not None and "max_tokns" in changes[-1].error
    status = {s.name: s for s in reg.status()}["acme"]
    assert status.version == good.version and status.error is not None
    assert "line 5" in status.error
    assert reg.reload_failures == 1


def test_conflicting_bindings_are_reported(folder: Path) -> None:
    write(folder / "other.yaml", "name: other\napplies_to:\n  tenants: [acme]\n")
    reg = registry(folder, [])
    assert reg.for_identity(ALICE).policy.name == "acme"
    errors = [s.error for s in reg.status() if s.error]
    assert any("already bound" in e for e in errors)


@pytest.mark.parametrize(
    "corrupted",
    [
        b"",  # emptied
        b"name: acme\napplies_to:\n  tenants: [ac",  # cut off mid-write
        b"\x00\xff\xfe\x89PNG\r\n\x1a\n\x00\x00",  # binary garbage
        b"name: acme\n\tmodel: {max_tokens: 1\n",  # not YAML
    ],
)
def test_a_corrupted_file_keeps_the_last_good_policy(folder: Path, corrupted: bytes) -> None:
    reg = registry(folder, [])
    good = reg.for_identity(ALICE)
    write(folder / "acme.yaml", corrupted)
    reg.reload()
    assert reg.for_identity(ALICE) is good
    assert reg.reload_failures == 1


def test_a_configmap_update_swaps_in_even_with_the_same_size_and_time(tmp_path: Path) -> None:
    """The kubelet's update: a new folder of files behind the `..data` link."""
    text = "name: acme\napplies_to:\n  tenants: [acme]\nmodel:\n  max_tokens: {}\n"
    volume = ConfigMapVolume(tmp_path, {"acme.yaml": text.format(100)})
    reg = registry(tmp_path, [])
    assert reg.for_identity(ALICE).policy.model.max_tokens == 100
    volume.update({"acme.yaml": text.format(420)}, same_times=True)  # one byte longer
    assert reg.reload() and reg.for_identity(ALICE).policy.model.max_tokens == 420
    volume.update({"acme.yaml": text.format(421)}, same_times=True)  # same size and time
    assert reg.reload() and reg.for_identity(ALICE).policy.model.max_tokens == 421

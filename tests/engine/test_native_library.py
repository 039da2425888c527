"""The native library: built once per machine, its ABI checked before any call."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import pytest
import torch

from engine import native_library
from engine.kv_pool import KVPool
from engine.llama import PagedLlama
from engine.native_decode import NativeDecoder
from engine.native_library import ABI_VERSION, Layer, Model, Projection, find_compiler
from tests.engine.conftest import LoadLibrary, needs_compiler, tiny_llama

# A build that must never be called: an older ABI, and a decode step that leaves a mark.
STALE_SOURCE = r"""
#include <stdint.h>
#include <stdio.h>
void bastion_abi(int64_t out[4]) { out[0] = VERSION; out[1] = out[2] = out[3] = 0; }
int bastion_packed_layout(int64_t out, int64_t in, int64_t group) { return 0; }
int bastion_decode_step(void) {
    FILE *mark = fopen(MARK, "w");
    if (mark) fclose(mark);
    return 0;
}
"""


def reported_abi(library: ctypes.CDLL) -> tuple[int, ...]:
    answers = (ctypes.c_int64 * 4)()
    library.bastion_abi(answers)
    return tuple(answers)


@needs_compiler
def test_the_library_is_built_once_per_machine(load_afresh: LoadLibrary, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert load_afresh(True, cache) is not None
    (built,) = cache.glob("decode_step-*.so")
    first = built.stat().st_mtime_ns
    assert load_afresh(True, cache) is not None
    assert list(cache.glob("*")) == [built] and built.stat().st_mtime_ns == first


@needs_compiler
def test_the_ctypes_mirrors_have_the_c_structs_sizes(load_afresh: LoadLibrary) -> None:
    library = load_afresh()
    sizes = (ctypes.sizeof(Projection), ctypes.sizeof(Layer), ctypes.sizeof(Model))
    assert reported_abi(library) == (ABI_VERSION, *sizes)


@needs_compiler
@pytest.mark.parametrize("stale", ["older ABI version", "not a library"])
def test_a_stale_cached_build_is_rebuilt_not_called(
    load_afresh: LoadLibrary, tmp_path: Path, stale: str
) -> None:
    compiler = find_compiler()
    assert compiler is not None
    cache, mark = tmp_path / "cache", tmp_path / "stale-build-called"
    target = native_library.library_path(cache, compiler)
    cache.mkdir()
    if stale == "not a library":
        target.write_bytes(b"not a shared object")
    else:
        source = tmp_path / "stale.c"
        source.write_text(STALE_SOURCE)
        defines = [f"-DVERSION={ABI_VERSION - 1}", f'-DMARK="{mark}"']
        command = [compiler, "-shared", "-fPIC", *defines, "-o", str(target), str(source)]
        subprocess.run(command, check=True)
    stale_bytes = target.read_bytes()
    library = load_afresh(True, cache)
    assert library is not None
    assert target.read_bytes() != stale_bytes  # rebuilt in its place
    assert reported_abi(library)[0] == ABI_VERSION
    model = PagedLlama.from_hf(tiny_llama(seed=13), torch.device("cpu"), torch.float32, "int8")
    pool = KVPool.allocate(model.kv_layout, 1, 4, torch.device("cpu"))
    decoder = NativeDecoder(library, model, pool)
    logits = decoder.step(torch.tensor([3]), torch.tensor([0]), torch.zeros(1, 1), 1)
    assert torch.isfinite(logits).all() and logits.abs().sum() > 0  # the real kernel ran
    assert not mark.exists()  # the stale one never did


@needs_compiler
def test_a_build_whose_abi_differs_from_the_mirrors_is_never_called(
    load_afresh: LoadLibrary, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As when engine/native_library.py's mirrors change without decode_step.c: even a
    fresh build is refused, and the engine keeps its PyTorch path."""
    monkeypatch.setattr(native_library, "ABI_VERSION", ABI_VERSION + 1)
    cache = tmp_path / "cache"
    assert load_afresh(True, cache) is None
    assert len(list(cache.glob("decode_step-*.so"))) == 1  # built, then refused

"""engine/native/decode_step.c as a loaded library: compiled, cached, and checked at load.

The C source ships with the package and is compiled on first use with the machine's C
compiler (`-march=native`), into a cache keyed by the source, the compiler and the CPU.
Before anything else is called, the library reports its ABI version and the sizes of the
structs mirrored here by hand; a cached build that answers otherwise (stale, damaged, from
another source) is rebuilt, never called. Where there is no compiler or it fails, the
engine keeps its PyTorch path: the native step is an accelerator, never a requirement.
"""

from __future__ import annotations

import _ctypes
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import structlog

from engine.cpu_info import cpuinfo

log = structlog.get_logger(__name__)

SOURCE = Path(__file__).with_name("native") / "decode_step.c"
# BASTION_ABI_VERSION in decode_step.c: bumped together with any change to the structs
# below or to an exported function's signature.
ABI_VERSION = 3
_COMPILE_FLAGS = ("-O3", "-march=native", "-pthread", "-shared", "-fPIC")

_int64 = ctypes.c_int64
_ptr = ctypes.c_void_p


class Projection(ctypes.Structure):
    """`Projection` in decode_step.c: int8 weights, their scales and bias."""

    _fields_ = [
        ("weight", _ptr),
        ("scale", _ptr),
        ("bias", _ptr),
        ("out", _int64),
        ("in_", _int64),
        ("group", _int64),
    ]


class Layer(ctypes.Structure):
    """`Layer` in decode_step.c: a decoder layer's norms, projections and KV pool."""

    _fields_ = [
        ("input_norm", _ptr),
        ("post_norm", _ptr),
        ("qkv", Projection),
        ("o", Projection),
        ("gate_up", Projection),
        ("down", Projection),
        ("k_cache", _ptr),
        ("v_cache", _ptr),
    ]


class Model(ctypes.Structure):
    """`Model` in decode_step.c: the dimensions, RoPE tables, layers and output head."""

    _fields_ = [
        ("num_layers", _int64),
        ("hidden", _int64),
        ("num_heads", _int64),
        ("num_kv_heads", _int64),
        ("head_dim", _int64),
        ("intermediate", _int64),
        ("num_slots", _int64),
        ("kv_bf16", _int64),
        ("eps", ctypes.c_float),
        ("cos", _ptr),
        ("sin", _ptr),
        ("final_norm", _ptr),
        ("lm_head", Projection),
        ("layers", ctypes.POINTER(Layer)),
    ]


def _expected_abi() -> tuple[int, ...]:
    """What `bastion_abi` must report: the version, then the structs' sizes."""
    return (ABI_VERSION, ctypes.sizeof(Projection), ctypes.sizeof(Layer), ctypes.sizeof(Model))


class AbiMismatch(RuntimeError):
    """A built library's ABI differs from the one this module mirrors."""


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME (else ~/.cache), then bastion/native."""
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "bastion" / "native"


def find_compiler() -> str | None:
    """The C compiler: $CC, else `cc` or `gcc` on PATH."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _cpu_identity() -> str:
    """The CPU's model name and feature flags: a library built with `-march=native` runs
    only where both match (one model name can span CPU generations)."""
    lines = [line for line in cpuinfo().splitlines() if line.startswith(("model name", "flags"))]
    return "\n".join(dict.fromkeys(lines)) or platform.processor()


def library_path(cache_dir: Path, compiler: str) -> Path:
    """Where the build of this source, with this compiler, for this CPU is cached."""
    parts = [
        SOURCE.read_bytes(),
        compiler.encode(),
        " ".join(_COMPILE_FLAGS).encode(),
        _cpu_identity().encode(),
    ]
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
    return cache_dir / f"decode_step-{key}.so"


def _compile(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("native_decode.compiling", source=str(SOURCE), target=str(target))
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        subprocess.run(
            [compiler, *_COMPILE_FLAGS, "-o", str(built), str(SOURCE), "-lm"],
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        )
        os.replace(built, target)  # atomic: concurrent builders each write a whole file


def _abi_mismatch(library: ctypes.CDLL) -> str | None:
    """Why `library` must not be called, or None where its ABI is the one mirrored here."""
    try:
        report = library.bastion_abi
    except AttributeError:
        return "it exports no bastion_abi"
    report.restype = None
    report.argtypes = [ctypes.POINTER(_int64)]
    answers = (_int64 * 4)()
    report(answers)
    reported, expected = tuple(answers), _expected_abi()
    if reported != expected:
        return f"it reports ABI {reported} (version, struct sizes), expected {expected}"
    return None


def _declare(library: ctypes.CDLL) -> None:
    """The exported functions' signatures, for ctypes to convert the arguments."""
    library.bastion_packed_layout.restype = ctypes.c_int
    library.bastion_packed_layout.argtypes = [_int64, _int64, _int64]
    library.bastion_pack_shape.restype = None
    library.bastion_pack_shape.argtypes = [ctypes.POINTER(_int64)]
    step = library.bastion_decode_step
    step.restype = ctypes.c_int
    step.argtypes = [
        ctypes.POINTER(Model),
        _int64,
        _ptr,
        _ptr,
        _ptr,
        _int64,
        _ptr,
        _int64,
        _ptr,
        ctypes.c_int,
    ]


def _open(path: Path) -> ctypes.CDLL:
    """The library at `path`, its ABI checked (AbiMismatch: unloaded again, never called)."""
    library = ctypes.CDLL(str(path))
    mismatch = _abi_mismatch(library)
    if mismatch is not None:
        # Unloaded, so that a rebuild at the same path is loaded afresh: the dynamic
        # loader hands back an already loaded library for a path it has seen.
        _ctypes.dlclose(library._handle)
        raise AbiMismatch(f"{path}: {mismatch}")
    _declare(library)
    return library


def _build_and_open(compiler: str, cache_dir: Path) -> ctypes.CDLL:
    target = library_path(cache_dir, compiler)
    if target.exists():
        try:
            return _open(target)
        except (OSError, AbiMismatch) as exc:  # stale or damaged: rebuilt below
            log.warning("native_decode.rebuilding", library=str(target), reason=str(exc))
    _compile(compiler, target)
    return _open(target)


@functools.cache
def load_library(enabled: bool = True, cache_dir: Path | None = None) -> ctypes.CDLL | None:
    """The native decode library, or None (disabled, no compiler, the build failed, or its
    ABI differs). `cache_dir` None: `default_cache_dir()`."""
    if not enabled:
        return None
    compiler = find_compiler()
    if compiler is None:
        log.warning("native_decode.unavailable", reason="no C compiler on PATH")
        return None
    try:
        return _build_and_open(compiler, cache_dir or default_cache_dir())
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:  # RuntimeError: no home
        detail = getattr(exc, "stderr", None) or str(exc)
        log.warning("native_decode.unavailable", reason=str(detail)[-2000:])
        return None

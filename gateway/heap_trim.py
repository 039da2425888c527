"""Give the C heap's free pages back to the system on a beat.

Under load, PyTorch's activations of ever-changing shapes and other native buffers are
allocated and freed through glibc's malloc, which keeps freed memory in its heap: the
64-client load grew the server's `[heap]` mapping by about 235 MiB in 3 minutes, and one
`malloc_trim(0)` afterwards returned all of it and more (docs/benchmarks.md, "Load").
`malloc_trim(0)` also releases free pages in the middle of the heap, which the automatic trim
at the heap's top (`M_TRIM_THRESHOLD`) never reaches. Other C libraries (musl) have no
such call, and there this does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)


def glibc_malloc_trim() -> Callable[[int], int] | None:
    """glibc's `malloc_trim`, or None where the C library has none."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


@dataclass(frozen=True, slots=True)
class TrimResult:
    released: bool  # whether any memory went back to the system
    seconds: float


def trim_heap(trim: Callable[[int], int]) -> TrimResult:
    """Release every free page of every malloc arena (keeping no padding at the top)."""
    began = time.perf_counter()
    released = trim(0) == 1
    return TrimResult(released, time.perf_counter() - began)


async def trim_heap_periodically(interval_seconds: float) -> None:
    """Trim the heap every `interval_seconds`, off the event loop, until cancelled."""
    trim = glibc_malloc_trim()
    if trim is None:
        log.debug("heap_trim.unavailable")
        return
    while True:
        await asyncio.sleep(interval_seconds)
        result = await asyncio.to_thread(trim_heap, trim)
        log.debug("heap_trim.done", released=result.released, ms=round(result.seconds * 1e3, 2))

"""Keep what loading frees out of an idle server's resident memory.

Loading allocates and frees large buffers: transformers' float32 copy of SmolLM2 while
its int8 weights are first prepared (about 0.5 GB), the embedder's copy, spaCy's model.
glibc's malloc serves a large allocation with its own `mmap`, unmapped when freed, but
each such free also raises its mmap threshold (up to 32 MiB), so later allocations below
it come from the heap, reusing pages the freed buffers touched, and those stay resident
however often the heap is trimmed: a first start, which prepares the weights, idled at
about 1.6 GB against 1.25 GB for a start that reads them (docs/benchmarks.md, "Cold
start"). A fixed threshold while loading keeps every large buffer in its own mapping;
afterwards it is SERVING_MMAP_THRESHOLD.
Elsewhere than glibc there is nothing to do.
"""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from gateway.heap_trim import glibc_malloc_trim, trim_heap

_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
LOADING_MMAP_THRESHOLD = 1 << 20
# After loading: a buffer this large takes milliseconds of compute to fill, against about
# one for its own mapping's page faults. At glibc's ceiling (32 MiB) a buffer of 8-32 MiB
# allocated and freed once the server was up kept its heap pages, and a fresh
# server on an AVX2-only CPU idled 33 MiB higher, over issue 20's 1.5 GB.
SERVING_MMAP_THRESHOLD = 8 << 20


def _mallopt() -> Callable[[int, int], int] | None:
    """The C library's `mallopt`, or None where it has none."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt


@contextmanager
def large_allocations_unmapped_when_freed() -> Iterator[None]:
    """Within the block, every allocation of `LOADING_MMAP_THRESHOLD` or more is a mapping
    of its own; then the threshold is `SERVING_MMAP_THRESHOLD`."""
    mallopt = _mallopt()
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, LOADING_MMAP_THRESHOLD)
    try:
        yield
    finally:
        if mallopt is not None:
            mallopt(_M_MMAP_THRESHOLD, SERVING_MMAP_THRESHOLD)


def return_freed_memory() -> None:
    """Collect garbage, then give every free page of every malloc arena back to the system
    (an idle server's RSS would count them)."""
    gc.collect()
    trim = glibc_malloc_trim()
    if trim is not None:
        trim_heap(trim)

"""gateway/heap_trim.py: freed heap memory in the middle of glibc's heap goes back to the
system, which the automatic trim at the heap's top never does."""

from __future__ import annotations

import asyncio
import ctypes
import os
from collections.abc import Iterator

import pytest

from gateway.heap_trim import glibc_malloc_trim, trim_heap, trim_heap_periodically

LIBC = ctypes.CDLL(None)
LIBC.malloc.restype = ctypes.c_void_p
LIBC.malloc.argtypes = [ctypes.c_size_t]
LIBC.free.argtypes = [ctypes.c_void_p]
BLOCK = 4096  # below the mmap threshold: served from the heap
BLOCKS = 16_384  # 64 MiB

pytestmark = pytest.mark.skipif(glibc_malloc_trim() is None, reason="C library is not glibc")


def resident_mib() -> float:
    with open(f"/proc/{os.getpid()}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.fixture
def freed_heap() -> Iterator[float]:
    """64 MiB written then freed below one block that stays taken, so the heap's top cannot
    shrink: the free memory stays resident until trimmed. Yields the resident MiB then."""
    blocks = [LIBC.malloc(BLOCK) for _ in range(BLOCKS)]
    for block in blocks:
        ctypes.memset(block, 1, BLOCK)
    pin = LIBC.malloc(BLOCK)
    for block in blocks:
        LIBC.free(block)
    yield resident_mib()
    LIBC.free(pin)


def test_a_trim_returns_free_heap_pages(freed_heap: float) -> None:
    trim = glibc_malloc_trim()
    assert trim is not None
    result = trim_heap(trim)
    assert result.released
    assert resident_mib() < freed_heap - 48  # most of the 64 MiB went back


def test_the_periodic_task_trims_on_its_beat(freed_heap: float) -> None:
    async def run_a_while() -> None:
        task = asyncio.create_task(trim_heap_periodically(0.05))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run_a_while())
    assert resident_mib() < freed_heap - 48

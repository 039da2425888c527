"""What the CPU is, as Linux describes it in /proc/cpuinfo."""

from __future__ import annotations

import functools
from pathlib import Path


@functools.cache
def cpuinfo() -> str:
    """The text of /proc/cpuinfo, or "" where there is none (not Linux)."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


# CPU flags of native bfloat16 matrix instructions; without them PyTorch emulates bf16,
# slower than float32.
_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_has_bf16() -> bool:
    """Whether the CPU has native bf16 instructions (where its flags can't be read: no)."""
    for line in cpuinfo().splitlines():
        if line.startswith("flags"):
            return not _BF16_FLAGS.isdisjoint(line.split(":", 1)[1].split())
    return False

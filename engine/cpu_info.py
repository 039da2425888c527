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

"""Which of a request's stages go to a thread, and which run on the event loop.

A trip to the default thread pool queues behind every other request's trips: with 32
requests at once, the key lookup, rate limit, input screening and retrieval made 160 trips
for its 6 workers (2 cores) before the first request left. A stage the policy turned off
returns at once, so it stays on the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def run_stage(off_loop: bool, work: Callable[..., T], *args: Any) -> T:
    """`work(*args)` on a thread when it is real work (a model, presidio, an index, the
    database), else on the event loop."""
    if off_loop:
        return await asyncio.to_thread(work, *args)
    return work(*args)

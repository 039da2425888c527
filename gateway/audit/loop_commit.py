"""Group commit on the event loop, for a database that answers without waiting (a local
SQLite file).

Every streamed answer waits for its audit record before `[DONE]`. Handed to the writer
thread, a record waited for that thread to get the GIL from the event loop after each
statement, then for the loop to take the result back: 5-13 ms of an answer's end with 32
streams ending together, for a write that costs 0.2-0.3 ms of CPU (docs/benchmarks.md,
"Bastion in front of an upstream server"). Here the records that wait at the same time are
written by one call on the loop, in the loop iteration after the first of them came. A
write that would have to wait (the file locked by another writer, or the chain's lock held
by the writer thread) is not tried: its batch goes to the thread, which waits as long as
it must.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from functools import partial
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# The batch's outcomes, one per item, or None where writing now would have to wait.
TryWrite = Callable[[list[T]], Sequence[R | BaseException] | None]


class LoopGroupCommit(Generic[T, R]):
    """Writes the items submitted on an event loop in one iteration by one `try_write`;
    what it cannot write without waiting goes to `hand_over` (a thread's writer)."""

    def __init__(self, try_write: TryWrite[T, R], hand_over: Callable[[T], Future[R]]) -> None:
        self._try_write = try_write
        self._hand_over = hand_over
        # Per loop: each loop writes only what its own coroutines submitted.
        self._waiting: dict[asyncio.AbstractEventLoop, list[tuple[T, asyncio.Future[R]]]] = {}

    async def submit(self, item: T) -> R:
        """`item`'s outcome once written. Cancelling the wait does not withdraw the item:
        it is written all the same."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        waiting = self._waiting.setdefault(loop, [])
        waiting.append((item, future))
        if len(waiting) == 1:
            loop.call_soon(self._commit, loop)
        return await future

    def _commit(self, loop: asyncio.AbstractEventLoop) -> None:
        batch = self._waiting.pop(loop)
        try:
            outcomes = self._try_write([item for item, _ in batch])
        except BaseException as exc:  # never leave a waiter hanging, whatever failed
            outcomes = [exc] * len(batch)
        if outcomes is None:
            for item, future in batch:
                handed = asyncio.wrap_future(self._hand_over(item), loop=loop)
                handed.add_done_callback(partial(_settle_from, future))
            return
        for (_, future), outcome in zip(batch, outcomes, strict=True):
            if future.cancelled():
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)


def _settle_from(target: asyncio.Future[R], source: asyncio.Future[R]) -> None:
    if target.cancelled():
        return
    if source.cancelled():
        target.cancel()
    elif (error := source.exception()) is not None:
        target.set_exception(error)
    else:
        target.set_result(source.result())

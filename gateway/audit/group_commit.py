"""Group commit: items that wait at the same time are written by one call, on a thread.

Each audit record used to be its own transaction, one after another along the chain (about
3 ms each on SQLite), so the 32nd of 32 streams that ended together waited about 90 ms for
its `[DONE]`. Here one writer thread takes everything that waits, writes it in one call,
then takes what arrived meanwhile: a lone item is written at once, as before, and a burst
costs a few commits instead of one each. Nothing is held back to fill a batch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class GroupCommit(Generic[T, R]):
    """Hands the items submitted while a write runs to the next `write` call.

    `write(items)` returns one result or exception per item, in order (an exception it
    raises fails every item of that call). The writer thread waits `linger_s` for more
    before it ends, so a steady trickle reuses it; it is not a daemon, so what was
    submitted is written before the interpreter exits.
    """

    def __init__(
        self,
        write: Callable[[list[T]], Sequence[R | BaseException]],
        *,
        name: str,
        max_batch: int = 256,
        linger_s: float = 1.0,
    ) -> None:
        self._write = write
        self._name = name
        self._max_batch = max_batch
        self._linger_s = linger_s
        self._changed = threading.Condition()
        self._waiting: list[tuple[T, Future[R]]] = []
        self._running = False

    def submit(self, item: T) -> Future[R]:
        """Queue `item`; the future resolves once its write has returned. Cancelling the
        future does not withdraw the item: it is written all the same."""
        future: Future[R] = Future()
        with self._changed:
            self._waiting.append((item, future))
            if self._running:
                self._changed.notify()
                return future
            self._running = True
        try:
            threading.Thread(target=self._run, name=self._name).start()
        except BaseException:
            with self._changed:  # no writer started: nothing else was waiting for one
                self._running = False
                self._waiting.remove((item, future))
            raise
        return future

    def _run(self) -> None:
        while batch := self._next_batch():
            self._commit(batch)

    def _next_batch(self) -> list[tuple[T, Future[R]]]:
        with self._changed:
            if not self._waiting:
                self._changed.wait(self._linger_s)
            batch = self._waiting[: self._max_batch]
            del self._waiting[: self._max_batch]
            if not batch:
                self._running = False
            return batch

    def _commit(self, batch: list[tuple[T, Future[R]]]) -> None:
        # A future cancelled before this point still has its item written; it just gets
        # no result.
        live = [future.set_running_or_notify_cancel() for _, future in batch]
        try:
            outcomes = self._write([item for item, _ in batch])
        except BaseException as exc:  # never leave a waiter hanging, whatever failed
            outcomes = [exc] * len(batch)
        for (_, future), outcome, waiting in zip(batch, outcomes, live, strict=True):
            if not waiting:
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

"""Several async streams read as one, for the choices of one request that run at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import TypeVar

T = TypeVar("T")


class _Done:
    """A source's end, in the queue."""


async def merged(sources: Sequence[AsyncIterator[T]]) -> AsyncIterator[T]:
    """The items of every source as they come. The first failure of a source ends the
    whole; ending or closing it cancels every source still running."""
    queue: asyncio.Queue[T | _Done | Exception] = asyncio.Queue()

    async def pump(source: AsyncIterator[T]) -> None:
        try:
            async for item in source:
                await queue.put(item)
            await queue.put(_Done())
        except Exception as exc:  # handed to the reader, which raises it
            await queue.put(exc)

    tasks = [asyncio.create_task(pump(source)) for source in sources]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if isinstance(item, _Done):
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

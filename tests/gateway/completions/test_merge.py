"""The choices' streams read as one: interleaved, ended by the first failure, cancelled
together."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway.completions.merge import merged


async def ticks(name: str, count: int, delay: float, closed: list[str]) -> AsyncIterator[str]:
    try:
        for i in range(count):
            await asyncio.sleep(delay)
            yield f"{name}{i}"
    finally:
        closed.append(name)


async def failing(after: float) -> AsyncIterator[str]:
    await asyncio.sleep(after)
    raise ValueError("the engine refused")
    yield "never"


def test_items_come_as_each_source_yields_them() -> None:
    async def run() -> list[str]:
        closed: list[str] = []
        sources = [ticks("a", 3, 0.01, closed), ticks("b", 2, 0.025, closed)]
        return [item async for item in merged(sources)]

    items = asyncio.run(run())
    assert sorted(items) == ["a0", "a1", "a2", "b0", "b1"]
    assert items.index("a1") < items.index("b1")  # interleaved, not one source after another


def test_a_failure_ends_the_whole_and_stops_the_others() -> None:
    async def run() -> list[str]:
        closed: list[str] = []
        with pytest.raises(ValueError, match="refused"):
            async for _ in merged([ticks("slow", 100, 0.01, closed), failing(0.03)]):
                pass
        return closed

    assert asyncio.run(run()) == ["slow"]


def test_closing_early_cancels_every_source() -> None:
    async def run() -> list[str]:
        closed: list[str] = []
        stream = merged([ticks("a", 100, 0.01, closed), ticks("b", 100, 0.01, closed)])
        assert await anext(stream) in ("a0", "b0")
        await stream.aclose()  # type: ignore[attr-defined]
        return closed

    assert sorted(asyncio.run(run())) == ["a", "b"]

"""Guards handed to Litestar as one: each runs in order, sync or async, and the first
that refuses stops the others."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.http.errors import ApiError
from gateway.http.guards import in_turn


def test_guards_run_in_order_until_one_refuses() -> None:
    called: list[str] = []

    def guard(name: str, refuses: bool = False) -> Any:
        async def check(connection: Any, handler: Any) -> None:
            called.append(f"{name}:{connection}:{handler}")
            if refuses:
                raise ApiError(403, f"{name} refused", type="permission_error")

        return check

    def sync_guard(connection: Any, handler: Any) -> None:
        called.append(f"sync:{connection}:{handler}")

    asyncio.run(in_turn(guard("a"), sync_guard, guard("b"))("conn", "route"))
    assert called == ["a:conn:route", "sync:conn:route", "b:conn:route"]

    called.clear()
    with pytest.raises(ApiError, match="b refused"):
        asyncio.run(in_turn(guard("a"), guard("b", refuses=True), guard("c"))("conn", "route"))
    assert called == ["a:conn:route", "b:conn:route"]

"""Batched key lookups: requests that arrive together share a query, and none is answered
from a query that began before it arrived (a revocation counts at once)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from gateway.db.connection import make_db_engine, make_session_factory
from gateway.keys.lookup_batch import KeyLookups
from gateway.keys.store import create_key, revoke_key
from gateway.services import open_database
from gateway.settings import Settings


@pytest.fixture
def sessions(tmp_path: Path) -> sessionmaker[Session]:
    return open_database(Settings(data_dir=tmp_path))


def key_queries(sessions: sessionmaker[Session]) -> list[str]:
    """The key-table queries `sessions` runs from now on."""
    engine: Engine = sessions.kw["bind"]
    seen: list[str] = []

    def note(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "api_keys" in statement:
            seen.append(statement)

    event.listen(engine, "before_cursor_execute", note)
    return seen


@pytest.mark.parametrize("off_loop", [True, False], ids=["on-a-thread", "on-the-loop"])
def test_lookups_that_arrive_together_share_a_query_and_each_gets_its_own_answer(
    sessions: sessionmaker[Session], off_loop: bool
) -> None:
    alive, identity = create_key(sessions, "acme", "user")
    other, other_identity = create_key(sessions, "globex", "admin")
    revoked, revoked_identity = create_key(sessions, "acme", "user")
    revoke_key(sessions, revoked_identity.key_id)
    queries = key_queries(sessions)
    secrets = [alive, other, revoked, "bst_unknown", alive] * 6

    engine: Engine = sessions.kw["bind"]
    query_threads: set[int] = set()
    event.listen(
        engine, "before_cursor_execute", lambda *_: query_threads.add(threading.get_ident())
    )

    async def look_up_all() -> list[Any]:
        lookups = KeyLookups(sessions, asyncio.get_running_loop(), off_loop=off_loop)
        return await asyncio.gather(*(lookups.authenticate(s) for s in secrets))

    found = asyncio.run(look_up_all())

    assert found == [identity, other_identity, None, None, identity] * 6
    if off_loop:
        assert 1 <= len(queries) <= 2  # 30 lookups: one round, or two if the first began early
        assert threading.get_ident() not in query_threads
    else:  # nothing awaits during a round, so every lookup is in the first
        assert len(queries) == 1
        assert query_threads == {threading.get_ident()}


def test_a_lookup_that_arrives_while_a_query_runs_waits_for_the_next_one(
    sessions: sessionmaker[Session],
) -> None:
    """A key revoked while a round's query is running is refused to a request that came
    after the revocation: that request is answered by a query of its own round."""
    secret, identity = create_key(sessions, "acme", "user")
    engine: Engine = sessions.kw["bind"]
    in_query, go_on = threading.Event(), threading.Event()

    def hold_first(*_: Any) -> None:
        if not in_query.is_set():
            in_query.set()
            assert go_on.wait(10)

    event.listen(engine, "after_cursor_execute", hold_first)

    async def scenario() -> tuple[Any, Any]:
        lookups = KeyLookups(sessions, asyncio.get_running_loop(), off_loop=True)
        early = asyncio.ensure_future(lookups.authenticate(secret))
        assert await asyncio.to_thread(in_query.wait, 10)  # its round has read the key
        await asyncio.to_thread(revoke_key, sessions, identity.key_id)
        late = asyncio.ensure_future(lookups.authenticate(secret))
        await asyncio.sleep(0.05)  # `late` is waiting behind the running round
        go_on.set()
        return await early, await late

    early, late = asyncio.run(scenario())

    assert early == identity  # read before the revocation
    assert late is None


def test_a_failing_query_fails_every_lookup_of_its_round_and_the_next_round_runs(
    tmp_path: Path,
) -> None:
    """No table (as with a database that is not there): each waiting request gets the
    database's error, to answer with its 503."""
    sessions = make_session_factory(make_db_engine(f"sqlite:///{tmp_path / 'empty.db'}"))

    async def look_up() -> list[Any]:
        lookups = KeyLookups(sessions, asyncio.get_running_loop(), off_loop=False)
        first = await asyncio.gather(
            *(lookups.authenticate(f"bst_{n}") for n in range(3)), return_exceptions=True
        )
        second = await asyncio.gather(lookups.authenticate("bst_x"), return_exceptions=True)
        return [*first, *second]

    outcomes = asyncio.run(look_up())

    assert len(outcomes) == 4
    assert all(isinstance(outcome, OperationalError) for outcome in outcomes)


def test_the_requests_of_a_round_wake_one_loop_iteration_apart(
    sessions: sessionmaker[Session],
) -> None:
    """Woken in one iteration, a round's requests would each run on to the upstream before
    the loop looked at any socket again; one an iteration, the connections the first ones
    open are seen while the rest are still being prepared."""
    secret, identity = create_key(sessions, "acme", "user")

    async def scenario() -> tuple[list[int], list[Any]]:
        lookups = KeyLookups(sessions, asyncio.get_running_loop(), off_loop=False)
        iteration = 0
        woken_at: list[int] = []

        async def count_iterations() -> None:
            nonlocal iteration
            while True:
                await asyncio.sleep(0)
                iteration += 1

        async def look_up() -> Any:
            found = await lookups.authenticate(secret)
            woken_at.append(iteration)
            return found

        ticker = asyncio.create_task(count_iterations())
        found = await asyncio.gather(*(look_up() for _ in range(5)))
        ticker.cancel()
        return woken_at, found

    woken_at, found = asyncio.run(scenario())

    assert found == [identity] * 5
    assert woken_at == sorted(set(woken_at))  # no two in the same iteration

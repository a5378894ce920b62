"""The dialect contract, driven through the dialect objects themselves on every database
(the claim's part of it is test_conformance.py): an insert that ignores rows already
there, the wake-up — sent inside a transaction, it reaches a listening process on
commit, never before, and a rolled-back one never — and a transaction refused in a
deadlock, which may run again."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select

from aiojobqueue import JobQueue
from aiojobqueue.dialects.urls import dialect_for


async def test_insert_ignore_skips_rows_already_there(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()
    async with q:
        core = q._started()
        ops, G = core.db.ops, q._t.groups
        async with q.engine.begin() as conn:
            await ops.insert_ignore(conn, G, [{"group_key": "a"}, {"group_key": "b"}])
        async with q.engine.begin() as conn:  # "a" again, with a new one: no error
            await ops.insert_ignore(conn, G, [{"group_key": "a"}, {"group_key": "c"}])
            await ops.insert_ignore(conn, G, [{"group_key": "c"}])  # twice in one transaction
        async with q.engine.connect() as conn:
            keys = sorted((await conn.execute(select(G.c.group_key))).scalars())
        assert [k for k in keys if k in "abc"] == ["a", "b", "c"]


async def test_a_wake_up_arrives_on_commit_and_never_on_rollback(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue()
    async with q:
        ops = q._started().db.ops
        listener = dialect_for(q.engine, q._t).listener(q.engine)
        assert listener is not None, f"{ops.name} has no wake-up listener"
        woke = asyncio.Event()
        task = asyncio.create_task(listener.run(lambda payload: woke.set()))
        try:
            await asyncio.sleep(0.5)  # listening (PostgreSQL: LISTEN issued)
            woke.clear()
            async with q.engine.connect() as conn, conn.begin() as tx:
                await ops.notify(conn, "")
                await conn.execute(q._t.groups.insert().values(group_key="rolled-back"))
                await tx.rollback()
            await asyncio.sleep(0.5)
            assert not woke.is_set(), "a rolled-back wake-up arrived"
            async with q.engine.begin() as conn:
                await ops.notify(conn, "")
                await conn.execute(q._t.groups.insert().values(group_key="committed"))
                await asyncio.sleep(0.3)
                assert not woke.is_set(), "the wake-up arrived before the commit"
            await asyncio.wait_for(woke.wait(), 5)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


@pytest.mark.parametrize("db", ["postgresql", "mariadb"], indirect=True)
async def test_a_transaction_refused_in_a_deadlock_runs_again(
    make_queue: Callable[..., JobQueue],
) -> None:
    """Database.write_refused_again (a capped round's finalize and claim): a transaction
    the database refuses whole in a deadlock (DialectOps.is_rollback) runs again; an error
    that is not a refusal is not."""
    q = make_queue()
    async with q:
        db = q._started().db
        ops, G = db.ops, q._t.groups
        async with q.engine.begin() as conn:
            await ops.insert_ignore(conn, G, [{"group_key": "a"}, {"group_key": "b"}])

        def lock(key: str) -> Any:
            return ops.for_update(select(G.c.group_key).where(G.c.group_key == key))

        side_holds_b = asyncio.Event()
        attempts = 0

        async def side() -> None:
            async with q.engine.begin() as conn:
                # heavier than the other transaction (MariaDB refuses the lighter one)
                await ops.insert_ignore(conn, G, [{"group_key": f"s{i}"} for i in range(20)])
                await conn.execute(lock("b"))
                side_holds_b.set()
                await asyncio.sleep(0.3)  # the other one waits for b first (PostgreSQL
                await conn.execute(lock("a"))  # refuses the one whose wait is older)

        async def both(conn: Any) -> int:
            nonlocal attempts
            attempts += 1
            await conn.execute(lock("a"))
            if attempts == 1:
                await side_holds_b.wait()
            await conn.execute(lock("b"))
            return attempts

        helper = asyncio.create_task(side())
        assert await asyncio.wait_for(db.write_refused_again(both), 30) == 2
        await helper
        refused: list[BaseException] = []

        async def duplicate(conn: Any) -> None:
            try:
                await conn.execute(G.insert().values(group_key="a"))
            except Exception as exc:
                refused.append(exc)
                raise

        with pytest.raises(Exception):  # noqa: B017 - the driver's own error type
            await db.write_refused_again(duplicate)
        assert len(refused) == 1 and not ops.is_rollback(refused[0])


def test_the_schema_and_the_ops_agree_on_partial_indexes() -> None:
    # the schema leaves an index out where it could not be partial (dialects/columns.py);
    # the migrations and the census ask the ops class: both must say the same
    from aiojobqueue.dialects.columns import PARTIAL_INDEX_BACKENDS
    from aiojobqueue.dialects.mysql import MySQLOps
    from aiojobqueue.dialects.postgresql import PostgresOps
    from aiojobqueue.dialects.sqlite import SQLiteOps

    for ops in (PostgresOps, MySQLOps, SQLiteOps):
        assert ops.has_partial_indexes == (ops.name in PARTIAL_INDEX_BACKENDS), ops.name

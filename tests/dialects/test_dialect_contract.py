"""The dialect contract, driven through the dialect objects themselves on every database
(the claim's part of it is test_conformance.py): an insert that ignores rows already
there, and the wake-up — sent inside a transaction, it reaches a listening process on
commit, never before, and a rolled-back one never."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

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

"""SQLite's single-slot worker: few trips to the driver's thread, a short lease-ahead.

A capacity=1 worker's time went to thread hand-offs (aiosqlite runs every call in a thread
of its own) and to waiting for each round between two jobs; bench/wake.py measures the
rate against the raw claim1 + finalize1 loop. These tests hold the two mechanisms to their
bounds on a real file database.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiosqlite.core
import pytest
from sqlalchemy import func, select

from aiojobqueue import JobQueue
from aiojobqueue.worker.rounds import SHARED_AHEAD


async def test_a_statement_is_one_trip_to_the_driver_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BEGIN travels with the first statement, each statement (cursor, execute, rows,
    close) is one trip, COMMIT one, and the pool sends no rollback after it: 3 trips for a
    two-statement transaction (SQLAlchemy's own adapter makes 13)."""
    trips = [0]
    real = aiosqlite.core.Connection._execute

    async def counted(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        trips[0] += 1
        return await real(self, fn, *args, **kwargs)

    q = JobQueue(f"sqlite+aiosqlite:///{tmp_path}/jobs.db")
    async with q:
        monkeypatch.setattr(aiosqlite.core.Connection, "_execute", counted)
        J = q._t.jobs
        for _ in range(2):  # the second time on a connection the pool has seen
            before = trips[0]
            async with q.engine.begin() as conn:
                assert (await conn.execute(select(func.count()).select_from(J))).scalar() == 0
                assert (await conn.execute(select(func.max(J.c.id)))).scalar() is None
            assert trips[0] - before == 3
        # a transaction left by an error still rolls back (the write lock is let go)
        with pytest.raises(ZeroDivisionError):
            async with q.engine.begin() as conn:
                await conn.execute(select(func.count()).select_from(J))
                raise ZeroDivisionError
        await q.enqueue("t", {})  # would wait on the write lock of a transaction left open
        assert (await q.get(1)).state == "ready"


async def test_single_slot_worker_leases_at_most_a_few_ahead(tmp_path: Path) -> None:
    """A capacity=1 worker holds at most 1 + SHARED_AHEAD leases at any time (it leases
    ahead, but never hoards the queue), and runs every job once."""
    q = JobQueue(f"sqlite+aiosqlite:///{tmp_path}/jobs.db", capacity=1)
    held: list[int] = []
    ran: list[int] = []

    @q.handler("t")
    async def t(ctx: Any) -> None:
        ran.append(ctx.job_id)
        J = q._t.jobs
        async with q.engine.connect() as conn:
            held.append(int((await conn.execute(
                select(func.count()).select_from(J).where(J.c.state == "running"))).scalar()))
        await asyncio.sleep(0)

    async with q:
        async with q.batch() as batch:
            for _ in range(300):
                batch.add("t", {})
        await q.run_until_idle()
    assert sorted(ran) == list(range(1, 301))
    assert max(held) <= 1 + SHARED_AHEAD
    assert max(held) > 1  # it does lease ahead (the next job waits for no round)

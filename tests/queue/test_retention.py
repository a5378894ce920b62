"""Retention on every database: what one sweep deletes and what it keeps (whole finished DAGs
only), the stored retention, the lease, and bad input. The multi-process run with a SIGKILL
is tests/crash/test_retention_procs.py."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update

from aiojobqueue import ConfigurationError, JobQueue
from aiojobqueue.retention import Sweeper, last_sweep, read_retention, write_retention
from aiojobqueue.sweep import sweep
from aiojobqueue.timeutil import utcnow_plus


async def ids_of(q: JobQueue) -> set[int]:
    J = q._t.jobs
    return {r[0] for r in await q._read(lambda c: c.execute(select(J.c.id)))}


async def age(q: JobQueue, ids: list[int], seconds: float) -> None:
    """Move the finish times of ``ids`` ``seconds`` into the past (as if they had aged)."""
    J = q._t.jobs

    async def fn(conn: Any) -> None:
        rows = (await conn.execute(select(J.c.id, J.c.finished_at).where(J.c.id.in_(ids)))).all()
        for jid, fin in rows:
            if fin is not None:
                await conn.execute(update(J).where(J.c.id == jid).values(
                    finished_at=fin - timedelta(seconds=seconds)))

    await q._write(fn)


async def run_sweep(q: JobQueue, policy: dict[str, timedelta]) -> int:
    sw = Sweeper(q._started().db)
    await write_retention(q._started().db, policy)
    assert await q._write(sw.acquire)
    return await sweep(q._started().db, policy, sw.renew, batch=2, pause=0)


async def test_sweep_deletes_whole_finished_dags_only(queue: JobQueue) -> None:
    @queue.handler("ok")
    async def ok(ctx: Any) -> None:
        return None

    @queue.handler("boom")
    async def boom(ctx: Any) -> None:
        raise ValueError("no")

    # 1. a finished DAG: a container with two chained children, a job after it, tagged
    async with queue.batch() as b:
        box = b.container("box")
        c1 = b.add("ok", parent=box, tags=["x"])
        c2 = b.add("ok", parent=box, depends_on=[c1])
        after = b.add("ok", depends_on=[box])
    old_dag = [box.id, c1.id, c2.id, after.id]
    # 2. a done job a live (far future) job depends on: its component is live
    up = await queue.enqueue("ok")
    # 3. a container with a done child and a live child
    async with queue.batch() as b:
        box2 = b.container("box2")
        d1 = b.add("ok", parent=box2)
        b.add("ok", parent=box2, run_after=timedelta(hours=1))
    # 4. a failed job (retention for failed is longer) and a cancelled one (no retention)
    failed = await queue.enqueue("boom", max_attempts=1)
    await queue.run_until_idle()
    down = await queue.enqueue("ok", depends_on=[up], run_after=timedelta(hours=1))
    gone = await queue.enqueue("ok", run_after=timedelta(hours=1))
    await queue.cancel(gone)
    # 5. a finished DAG too recent to go
    recent = await queue.enqueue("ok")
    await queue.run_until_idle()

    everything = await ids_of(queue)
    old = [*old_dag, up, down, box2.id, d1.id, failed, gone]
    await age(queue, old, 3600)
    policy = {"done": timedelta(minutes=5), "failed": timedelta(days=1)}
    n = await run_sweep(queue, policy)
    assert n == len(old_dag)
    assert await ids_of(queue) == everything - set(old_dag)
    T, D = queue._t.tags, queue._t.deps
    assert await queue._read(lambda c: c.scalar(select(func.count()).select_from(T))) == 0
    assert await queue._read(lambda c: c.scalar(
        select(func.count()).select_from(D).where(D.c.job_id.in_(old_dag)))) == 0
    assert recent in await ids_of(queue)
    # the failed job goes once older than its own retention; a second sweep finds nothing
    await age(queue, [failed], 2 * 86400)
    assert await run_sweep(queue, policy) == 1
    assert failed not in await ids_of(queue)
    assert await run_sweep(queue, policy) == 0


async def test_stored_retention_and_lease(queue: JobQueue, make_queue: Any) -> None:
    db = queue._started().db
    assert await read_retention(db) == {}
    assert await write_retention(db, {"done": timedelta(days=7), "failed": 60})
    assert not await write_retention(db, {"failed": 60.0, "done": timedelta(days=7)})
    assert await read_retention(db) == {"done": timedelta(days=7), "failed": timedelta(seconds=60)}
    # declared by another process's JobQueue at start: stored where it differs
    other = make_queue(retention={"done": timedelta(hours=1)})
    async with other:
        assert await read_retention(db) == {"done": timedelta(hours=1)}
    # one lease holder at a time; a second worker gets it once the first's expires
    a, b = Sweeper(db), Sweeper(db)
    b.me = "other-worker"
    assert await queue._write(a.acquire)
    assert not await queue._write(b.acquire)
    assert not await queue._write(b.renew)
    X = queue._t.sweeps
    await queue._write(lambda c: c.execute(update(X).values(lease_expires=utcnow_plus(-60))))
    assert await queue._write(b.acquire)
    assert not await queue._write(a.renew)  # the old holder's batch would not commit
    await queue._write(lambda c: b.release(c, deleted=3))
    last = await last_sweep(db)
    assert last is not None and last.deleted == 3 and last.total == 3 and last.owner is None


@pytest.mark.parametrize("bad", [{"running": timedelta(1)}, {"done": timedelta(-1)},
                                 {"done": "7d"}, ["done"]])
async def test_bad_retention_is_refused(queue: JobQueue, bad: Any) -> None:
    with pytest.raises(ConfigurationError):
        await write_retention(queue._started().db, bad)
    with pytest.raises(ConfigurationError):
        JobQueue("sqlite:///x.db", retention=bad)
    assert await read_retention(queue._started().db) == {}

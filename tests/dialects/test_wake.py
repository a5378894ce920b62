"""An idle worker wakes for work another process made runnable, well before its poll.

Workers here poll every 30 s (``poll_interval``), so a job that starts within a few seconds
can only have come through the database's wake-up: LISTEN/NOTIFY on PostgreSQL, the
``data_version`` watch on SQLite, the doorbell in ``meta`` on MySQL/MariaDB. The other
process is a real one (a fresh interpreter, its own connections: another host as far as the
database can tell).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Integer, cast, func, select

from aiojobqueue import JobQueue
from aiojobqueue.dialects.mysql_bell import bell_names

#: the workers' poll: far longer than any wake the tests accept
POLL = 30.0
#: what "at once" means under a loaded CI box: a third of the poll
PROMPT = 10.0

PRODUCER = """
import asyncio, sys
from aiojobqueue import JobQueue
async def main(url, prefix):
    async with JobQueue(url, prefix=prefix) as q:
        await q.enqueue("t", {})
asyncio.run(main(sys.argv[1], sys.argv[2]))
"""

SYNC_PRODUCER = """
import sys
from aiojobqueue import SyncQueue
with SyncQueue(sys.argv[1], prefix=sys.argv[2]) as q:
    q.enqueue("t", {})
    with q.batch() as b:
        b.add("t", {})
"""

#: serves type "a" until it has run one, then exits (its poll is 30 s too)
UPSTREAM_WORKER = """
import asyncio, sys
from aiojobqueue import JobQueue
async def main(url, prefix):
    q = JobQueue(url, prefix=prefix, poll_interval=30.0)
    ran = asyncio.Event()
    @q.handler("a")
    async def a(ctx):
        ran.set()
    async with q:
        serving = asyncio.create_task(q.serve())
        await asyncio.wait_for(ran.wait(), 60)
        await asyncio.sleep(0.5)  # its finalize is written by the next round
        serving.cancel()
        try:
            await serving
        except asyncio.CancelledError:
            pass
asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def _env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}


async def _run_script(code: str, *args: str) -> None:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, *args, env=_env())
    assert await asyncio.wait_for(proc.wait(), 120) == 0


async def _idle_worker(q: JobQueue) -> asyncio.Task[None]:
    """serve() in the background, once its first round and its listener's first look are
    over (it then sleeps its 30 s poll)."""
    task = asyncio.create_task(q.serve())
    await asyncio.sleep(1.5)
    return task


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_enqueue_in_another_process_wakes_idle_worker(
    make_queue: Callable[..., JobQueue], db_url: str, prefix: str
) -> None:
    q = make_queue(poll_interval=POLL)
    started: list[float] = []
    ran = asyncio.Event()

    @q.handler("t")
    async def t(ctx: Any) -> None:
        started.append(time.monotonic())
        ran.set()

    async with q:
        worker = await _idle_worker(q)
        try:
            t0 = time.monotonic()
            await _run_script(PRODUCER, db_url, prefix)
            await asyncio.wait_for(ran.wait(), PROMPT)
        finally:
            await _stop(worker)
    assert started[0] - t0 < PROMPT


async def test_a_syncqueue_enqueue_wakes_idle_worker(
    make_queue: Callable[..., JobQueue], db_url: str, prefix: str
) -> None:
    """Synchronous code (a Flask view, a script) wakes the workers like JobQueue does: a
    lone enqueue and a batch, from another process, each on its own commit."""
    q = make_queue(poll_interval=POLL)
    started: list[float] = []
    both = asyncio.Event()

    @q.handler("t")
    async def t(ctx: Any) -> None:
        started.append(time.monotonic())
        if len(started) == 2:
            both.set()

    async with q:
        worker = await _idle_worker(q)
        try:
            t0 = time.monotonic()
            await _run_script(SYNC_PRODUCER, db_url, prefix)
            await asyncio.wait_for(both.wait(), PROMPT)
        finally:
            await _stop(worker)
    assert started[-1] - t0 < PROMPT


async def test_finish_in_another_process_wakes_worker_for_the_dependent(
    make_queue: Callable[..., JobQueue], db_url: str, prefix: str
) -> None:
    """Completion to next start across processes: the other process runs "a" (woken by
    this enqueue), its finalize releases "b", and this idle worker (which serves only "b")
    starts it at once."""
    q = make_queue(poll_interval=POLL)
    ran = asyncio.Event()

    @q.handler("b")
    async def b(ctx: Any) -> None:
        ran.set()

    async with q:
        upstream = asyncio.create_task(_run_script(UPSTREAM_WORKER, db_url, prefix))
        worker = await _idle_worker(q)
        try:
            await asyncio.sleep(1.0)  # the other process is up and idle too
            async with q.batch() as batch:
                a = batch.add("a", {})
                batch.add("b", {}, depends_on=[a])
            await asyncio.wait_for(ran.wait(), 2 * PROMPT)
            await asyncio.wait_for(upstream, 60)
        finally:
            upstream.cancel()
            await _stop(worker)


@pytest.mark.parametrize("db", ["mariadb"], indirect=True)
async def test_bell_rings_at_commit_only(make_queue: Callable[..., JobQueue]) -> None:
    """The bell moves once per committed transaction that made a job runnable, not for one
    rolled back, nor for a job that is not runnable yet (delayed)."""
    q = make_queue()
    async with q:
        M = q._t.meta

        async def bell() -> int:
            async with q.engine.connect() as conn:
                v = (await conn.execute(select(func.sum(cast(M.c.value, Integer)))
                                        .where(M.c.name.in_(bell_names())))).scalar()
            return int(v or 0)

        async with q.engine.begin() as conn:
            await conn.execute(M.insert(), [{"name": n, "value": "0"} for n in bell_names()])
        assert await bell() == 0
        await q.enqueue("t", {})
        assert await bell() == 1
        conn = await q.engine.connect()
        try:
            await conn.begin()
            async with q.batch(connection=conn) as batch:
                batch.add("t", {})
            await conn.rollback()
        finally:
            await conn.close()
        assert await bell() == 1
        await q.enqueue("t", {}, run_after=3600)
        assert await bell() == 1
        async with q.batch() as batch:
            for _ in range(3):
                batch.add("t", {})
        assert await bell() == 2


@pytest.mark.parametrize("db", ["mariadb"], indirect=True)
async def test_a_claim_passed_over_by_another_pick_looks_again(
    make_queue: Callable[..., JobQueue]
) -> None:
    """InnoDB's SKIP LOCKED also skips a row that another claim's locking pick only read on
    its way (a claim for type "a" holds the lock of the "b" job it rejected). The worker
    serving "b" that was passed over so looks again a moment later, not at its 30 s poll;
    nothing rings when the other claim ends, having leased nothing."""
    from conftest import eventually

    q = make_queue(poll_interval=POLL)
    started: list[float] = []

    @q.handler("b")
    async def b(ctx: Any) -> None:
        started.append(time.monotonic())

    async with q:
        await q.enqueue("b", {})
        J = q._t.jobs
        held = await q.engine.connect()
        try:
            await held.begin()
            other = await held.execute(
                select(J.c.id).where(J.c.state == "ready", J.c.type.in_(["a"]))
                .order_by(J.c.priority.desc(), J.c.id).limit(10)
                .with_for_update(skip_locked=True))
            assert other.all() == []  # (and the "b" row it read stays locked)
            worker = asyncio.create_task(q.serve())
            try:
                claimer = q._started().claimer
                await eventually(lambda: claimer.passed_over, timeout=PROMPT, every=0.002)
                assert not started  # the row was held: the claim found nothing to lease
                await held.rollback()
                await eventually(lambda: bool(started), timeout=PROMPT)
            finally:
                await _stop(worker)
        finally:
            await held.close()


@pytest.mark.parametrize("db", ["mariadb"], indirect=True)
async def test_bell_watch_comes_back_after_an_outage(
    make_queue: Callable[..., JobQueue], db_url: str, prefix: str
) -> None:
    """Every connection of the worker (its watch's too) is cut and refused for a second;
    afterwards an enqueue from another process still wakes it well before its poll."""
    from tcpproxy import TcpProxy

    async with TcpProxy.for_url(db_url) as px:
        make_queue()  # (the fixture drops the tables afterwards)
        q = JobQueue(px.url(db_url), prefix=prefix, poll_interval=POLL, lease_ttl=3.0,
                     heartbeat_interval=0.5, shutdown_timeout=2.0)
        ran = asyncio.Event()

        @q.handler("t")
        async def t(ctx: Any) -> None:
            ran.set()

        async with q:
            worker = await _idle_worker(q)
            try:
                await px.outage(1.0)
                await asyncio.sleep(4.0)  # the watch's backoff: 0.2 + 0.4 + 0.8 + 1.6 s
                await _run_script(PRODUCER, db_url, prefix)
                await asyncio.wait_for(ran.wait(), PROMPT)
            finally:
                await _stop(worker)


@pytest.mark.parametrize("db", ["postgresql"], indirect=True)
async def test_listener_connects_with_the_engines_connect_args(
    make_queue: Callable[..., JobQueue], db_url: str, prefix: str
) -> None:
    """A ready-made engine's ``connect_args`` (here ``server_settings``' application_name;
    SSL options alike) hold for the LISTEN connection too: the server shows the listener's
    connection under that name, another process's enqueue wakes the worker through it, and
    it is closed when the worker stops (taken out of the engine's pool, it is not left
    there)."""
    from conftest import eventually
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    name = f"ajq-listen-{prefix}"
    engine = create_async_engine(
        db_url, connect_args={"server_settings": {"application_name": name}})
    q = JobQueue(engine, prefix=prefix, poll_interval=POLL)  # (make_queue drops the tables)
    ran = asyncio.Event()

    @q.handler("t")
    async def t(ctx: Any) -> None:
        ran.set()

    async def listening() -> int:
        async with engine.connect() as conn:
            return int((await conn.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = :n "
                "AND query LIKE 'LISTEN %'"), {"n": name})).scalar_one())

    try:
        async with q:
            worker = await _idle_worker(q)
            try:
                await eventually(listening, timeout=PROMPT)
                assert await listening() == 1
                await _run_script(PRODUCER, db_url, prefix)
                await asyncio.wait_for(ran.wait(), PROMPT)
            finally:
                await _stop(worker)
            await eventually(lambda: _none(listening), timeout=PROMPT)
    finally:
        await engine.dispose()


async def _none(count: Callable[[], Any]) -> bool:
    return bool(await count() == 0)

"""Heartbeats: a job running far longer than lease_ttl keeps its lease (no other worker
process reclaims it), and settings that leave no room between beats are rejected."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import eventually
from crashkit import Fleet, fleet_factory  # noqa: F401 - fixture
from sqlalchemy import event
from sqlalchemy.exc import OperationalError

from aiojobqueue import JobContext, JobQueue, JobState
from aiojobqueue.errors import ConfigurationError


@pytest.mark.parametrize(("ttl", "hb"), [(1.0, 1.0), (1.9, 1.0), (0.5, 10.0)])
def test_lease_not_comfortably_above_heartbeat_is_rejected(ttl: float, hb: float) -> None:
    with pytest.raises(ConfigurationError, match="heartbeat_interval"):
        JobQueue("sqlite+aiosqlite:///unused.db", lease_ttl=ttl, heartbeat_interval=hb)
    JobQueue("sqlite+aiosqlite:///unused.db", lease_ttl=2 * hb, heartbeat_interval=hb)


@pytest.mark.slow
async def test_job_three_times_longer_than_lease_completes_once(
    make_queue: Callable[..., JobQueue], fleet_factory: Callable[..., Fleet]  # noqa: F811
) -> None:
    async with make_queue() as q:
        fleet = fleet_factory(ttl=2.0, hb=0.4)
        a = await fleet.start_one()
        jid = await q.enqueue("sleep", {"seconds": 6.0})  # 3 x lease_ttl
        await fleet.wait_for("start", job=jid)
        b = fleet.spawn()  # a second worker whose reclaimer would take an expired lease
        await fleet.ready(b)
        res = await q.wait(jid, timeout=40)
        job = await q.get(jid)
        assert job.state == JobState.DONE and job.attempts == 1, fleet.dump()
        assert res["pid"] == a.pid
        assert len(fleet.events("start", job=jid)) == 1
        await fleet.wait_for("fin", job=jid)  # logged by the hook just after the commit
        assert len(fleet.events("fin", job=jid)) == 1
        assert not fleet.events("cancelled") and not fleet.events("discarded")
        assert "reclaimed" not in fleet.worker_logs()


def _break_heartbeat(q: JobQueue, exc: Callable[[], Exception]) -> Callable[[], None]:
    """Make every heartbeat transaction fail (its worker-registry UPDATE raises), leaving
    claims and finalizes alone. Returns the function that heals it."""
    table = q._t.workers.name

    def before(conn: Any, cursor: Any, statement: str, *a: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE") and table in statement:
            raise exc()

    # the heartbeat's engine: the queue's, or on SQLite the side writer it runs on
    assert q._core is not None
    side = q._core.db.ops.side_writer(q.engine)
    engines = [e for e in (q.engine.sync_engine, side) if e is not None]
    for engine in engines:
        event.listen(engine, "before_cursor_execute", before)

    def heal() -> None:
        for engine in engines:
            event.remove(engine, "before_cursor_execute", before)

    return heal


def _work_handler(q: JobQueue, log: list[tuple[str, int, int, float]]) -> None:
    @q.handler("work")
    async def work(ctx: JobContext, seconds: float) -> int:
        log.append(("start", ctx.job_id, ctx.attempt, time.monotonic()))
        try:
            await asyncio.sleep(seconds if ctx.attempt == 1 else 0.0)  # re-runs are quick
        except asyncio.CancelledError:
            log.append(("stopped", ctx.job_id, ctx.attempt, time.monotonic()))
            raise
        return ctx.attempt


async def test_failing_heartbeat_stops_the_job_before_its_lease_can_expire(
    make_queue: Callable[..., JobQueue], caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "aiojobqueue")
    # the guard stops a job lease_ttl - min(heartbeat, ttl/4) after its last renewal (2.25 s),
    # leaving 0.75 s of slack for a loaded machine before the 3 s lease could expire
    q = make_queue(lease_ttl=3.0, heartbeat_interval=0.8)
    runs: list[tuple[str, int, int, float]] = []
    _work_handler(q, runs)
    async with q:
        jid = await q.enqueue("work", {"seconds": 5.0}, max_attempts=1)
        serving = asyncio.create_task(q.serve())
        try:
            await eventually(lambda: runs, 20)
            t_fault = time.monotonic()
            heal = _break_heartbeat(q, lambda: OperationalError("UPDATE", {}, OSError("down")))
            await eventually(lambda: any(r[0] == "stopped" for r in runs), 10)
            stopped = next(r for r in runs if r[0] == "stopped")
            # stopped before the lease (3 s, last renewed before the fault) could expire
            assert stopped[3] - t_fault < 3.0, stopped[3] - t_fault
            other = await q.enqueue("work", {"seconds": 0.0})
            await asyncio.sleep(1.0)
            assert not [r for r in runs if r[1] == other]  # no claims while leases are unsure
            heal()
            assert await q.wait(jid, timeout=20) == 2
            assert await q.wait(other, timeout=20) == 1
        finally:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
        job = await q.get(jid)
    # max_attempts=1, yet the stopped attempt was released, not held against it
    assert job.state == JobState.DONE and job.attempts == 2
    assert [r[:3] for r in runs if r[1] == jid] == [
        ("start", jid, 1), ("stopped", jid, 1), ("start", jid, 2)]
    assert "heartbeat failed" in caplog.text and "lease unrenewed" in caplog.text


async def test_crashed_heartbeat_stops_serve_loudly_and_releases_its_jobs(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue(lease_ttl=2.0, heartbeat_interval=0.4, shutdown_timeout=30.0)
    runs: list[tuple[str, int, int, float]] = []
    _work_handler(q, runs)
    async with q:
        jid = await q.enqueue("work", {"seconds": 60.0}, max_attempts=1)
        serving = asyncio.create_task(q.serve())
        await eventually(lambda: runs, 20)
        t_fault = time.monotonic()
        heal = _break_heartbeat(q, lambda: RuntimeError("a bug in the heartbeat"))
        with pytest.raises(BaseExceptionGroup) as ei:
            await asyncio.wait_for(serving, 20)
        took = time.monotonic() - t_fault
        assert ei.group_contains(RuntimeError, match="a bug in the heartbeat")
        # not after shutdown_timeout (30 s): the lease could not be renewed while waiting
        assert took < 2.0 + 1.0, took
        job = await q.get(jid)
        assert job.state == JobState.READY and job.lease_owner is None  # released
        heal()
        q2 = make_queue(lease_ttl=2.0, heartbeat_interval=0.4)
        runs2: list[tuple[str, int, int, float]] = []
        async with q2:
            _work_handler(q2, runs2)
            await _finish_with(q2, jid)
            assert (await q2.get(jid)).attempts == 2


async def _finish_with(q: JobQueue, jid: int) -> None:
    from sqlalchemy import update

    J = q._t.jobs
    # make the restarted run short
    await q._write(lambda conn: conn.execute(
        update(J).where(J.c.id == jid).values(args={"seconds": 0.0})))
    serving = asyncio.create_task(q.serve())
    try:
        assert await q.wait(jid, timeout=20) == 2
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)

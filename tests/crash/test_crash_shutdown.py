"""Graceful shutdown: stop claiming, let running jobs finish within shutdown_timeout, then
cancel and release the rest so another worker starts them at once (not after lease_ttl)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from crashkit import Fleet, fleet_factory  # noqa: F401 - fixture

from aiojobqueue import JobContext, JobQueue, JobState


@pytest.mark.slow
async def test_sigterm_finishes_short_jobs_and_hands_long_ones_over_at_once(
    make_queue: Callable[..., JobQueue], fleet_factory: Callable[..., Fleet]  # noqa: F811
) -> None:
    async with make_queue() as q:
        # a 60 s lease: a job that had to wait for its lease to expire would take a minute
        fleet = fleet_factory(ttl=60.0, hb=1.0, shutdown_timeout=1.5)
        a = fleet.spawn()
        await fleet.ready(a)
        long_id = await q.enqueue("sleep", {"seconds": 30.0}, max_attempts=1)
        await fleet.wait_for("start", job=long_id, pid=a.pid)
        short_id = await q.enqueue("sleep", {"seconds": 0.8})
        await fleet.wait_for("start", job=short_id, pid=a.pid)
        b = fleet.spawn()
        await fleet.ready(b)
        fleet.term(a)
        term = fleet.events("term")[0]["t"]
        assert a.wait(timeout=20) == 0, fleet.dump()
        # the short job finished on A within the grace period
        assert (await q.wait(short_id, timeout=5))["pid"] == a.pid
        # the long one was cancelled, released, and B started it at once
        await fleet.wait_for("cancelled", job=long_id, pid=a.pid)
        await fleet.wait_for("released", job=long_id, pid=a.pid)
        restart = await fleet.wait_for("start", timeout=15, job=long_id, pid=b.pid)
        delay = restart["t"] - term
        assert delay < 10.0, fleet.dump()  # shutdown_timeout 1.5 s + a poll; lease_ttl 60 s
        print(f"long job restarted on another worker {delay:.2f}s after SIGTERM (lease 60 s)")
        job = await q.get(long_id)
        # max_attempts=1 and yet it runs again: an interrupted attempt is not held against it
        assert job.state == JobState.RUNNING and job.attempts == 2 and job.lease_owner
        assert not [e for e in fleet.events("start", pid=a.pid) if e["t"] > term]  # no claims
        await q.cancel(long_id)


async def test_cancelling_serve_releases_running_jobs(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue(lease_ttl=60.0, heartbeat_interval=1.0, shutdown_timeout=0.3)
    started = asyncio.Event()
    stopped: list[str] = []

    @q.handler("forever", max_attempts=1)
    async def forever(ctx: JobContext) -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stopped.append("cancelled")
            raise

    async with q:
        jid = await q.enqueue("forever", {})
        serving = asyncio.create_task(q.serve())
        await asyncio.wait_for(started.wait(), 20)
        serving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await serving
        job = await q.get(jid)
        assert stopped == ["cancelled"]
        assert job.state == JobState.READY and job.lease_owner is None  # runnable at once
        assert job.attempts == 1


@pytest.mark.slow
@pytest.mark.parametrize("db", ["sqlite"], indirect=True)  # signal handling is not dialectal
async def test_sigint_and_a_second_signal_release_at_once(
    make_queue: Callable[..., JobQueue], fleet_factory: Callable[..., Fleet]  # noqa: F811
) -> None:
    import signal

    async with make_queue() as q:
        fleet = fleet_factory(ttl=60.0, hb=1.0, shutdown_timeout=60.0)
        a = fleet.spawn()
        await fleet.ready(a)
        jid = await q.enqueue("sleep", {"seconds": 600.0})
        await fleet.wait_for("start", job=jid, pid=a.pid)
        fleet.note("sigint", child=a.pid)
        a.send_signal(signal.SIGINT)
        await asyncio.sleep(0.5)
        assert a.poll() is None  # waiting for the job (shutdown_timeout 60 s)
        a.send_signal(signal.SIGINT)  # impatient operator: stop now
        assert a.wait(timeout=15) == 0, fleet.dump()
        await fleet.wait_for("released", job=jid, pid=a.pid)
        job = await q.get(jid)
        assert job.state == JobState.READY and job.lease_owner is None and job.attempts == 1


async def test_cancel_requested_just_before_shutdown_is_not_lost(
    make_queue: Callable[..., JobQueue],
) -> None:
    """cancel() lands, then the worker shuts down before its heartbeat saw the request: the
    release must not turn the job runnable again (the next claim would clear the flag)."""
    q = make_queue(lease_ttl=20.0, heartbeat_interval=5.0, shutdown_timeout=0.1)
    started = asyncio.Event()

    @q.handler("forever")
    async def forever(ctx: JobContext) -> None:
        started.set()
        await asyncio.sleep(3600)

    async with q:
        jid = await q.enqueue("forever", {})
        dep = await q.enqueue("forever", {}, depends_on=[jid])
        serving = asyncio.create_task(q.serve())
        await asyncio.wait_for(started.wait(), 20)
        await asyncio.sleep(0.2)  # past the first heartbeat; the next one is 5 s away
        await q.cancel(jid)
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        job = await q.get(jid)
        assert job.state == JobState.CANCELLED, job
        assert (await q.get(dep)).state == JobState.CANCELLED

"""Dead workers: a SIGKILLed worker's job is reclaimed by another process once its lease
expires (the attempt counted), and a job that kills every worker it runs on ends failed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from crashkit import Fleet, fleet_factory  # noqa: F401 - fixture

from aiojobqueue import JobQueue, JobState

pytestmark = pytest.mark.slow


async def test_sigkilled_worker_job_is_reclaimed_elsewhere(
    make_queue: Callable[..., JobQueue], fleet_factory: Callable[..., Fleet]  # noqa: F811
) -> None:
    async with make_queue() as q:
        fleet = fleet_factory(ttl=2.0, hb=0.4)
        a = await fleet.start_one()
        jid = await q.enqueue("sleep", {"seconds": 3.0}, max_attempts=3)
        await fleet.wait_for("start", job=jid, attempt=1, pid=a.pid)
        b = fleet.spawn()
        await fleet.ready(b)
        fleet.kill(a)
        res = await q.wait(jid, timeout=30)
        job = await q.get(jid)
        kill = fleet.events("kill")[0]
        second = fleet.events("start", job=jid, attempt=2)
        assert res["pid"] == b.pid and res["attempt"] == 2, fleet.dump()
        assert job.attempts == 2 and job.state == JobState.DONE
        assert len(second) == 1 and second[0]["t"] > kill["t"]
        # never before the lease could have expired: the lease was renewed by a live worker
        assert second[0]["t"] - kill["t"] > 0.5, fleet.dump()
        await fleet.wait_for("fin", job=jid)  # logged by the hook just after the commit
        assert len(fleet.events("fin", job=jid)) == 1
        print(f"reclaimed and restarted {second[0]['t'] - kill['t']:.2f}s after SIGKILL "
              f"(lease_ttl 2.0s)")


async def test_job_that_kills_its_worker_fails_after_max_attempts(
    make_queue: Callable[..., JobQueue], fleet_factory: Callable[..., Fleet]  # noqa: F811
) -> None:
    async with make_queue() as q:
        fleet = fleet_factory(ttl=1.5, hb=0.3)
        jid = await q.enqueue("suicide", {}, max_attempts=2)
        fine = await q.enqueue("sleep", {"seconds": 0.0})
        deaths = 0
        fleet.spawn()
        t_end = time.monotonic() + 60
        while (await q.get(jid)).state not in (JobState.FAILED, JobState.DONE,
                                               JobState.CANCELLED):
            assert time.monotonic() < t_end, fleet.dump()
            if not fleet.alive():  # a supervisor restarts dead workers
                deaths += 1
                fleet.spawn()
            await asyncio.sleep(0.1)
        job = await q.get(jid)
        assert job.state == JobState.FAILED, fleet.dump()
        assert job.attempts == 2
        assert job.error["type"] == "LeaseExpired", job.error
        assert "stopped renewing its lease" in job.error["message"]
        assert len(fleet.events("start", job=jid)) == 2  # one run per attempt, no more
        assert deaths >= 1
        assert (await q.wait(fine, timeout=30))["job"] == fine
        # it stays failed: nothing picks it up again
        await asyncio.sleep(1.5)
        assert (await q.get(jid)).attempts == 2


async def test_worker_killed_after_job_end_before_finalize(
    make_queue: Callable[..., JobQueue], fleet_factory: Callable[..., Fleet]  # noqa: F811
) -> None:
    """The handler finished but the process died before writing the outcome: the lease
    expires and another worker runs the job again; the lost attempt's result never lands."""
    async with make_queue() as q:
        fleet = fleet_factory(ttl=2.0, hb=0.4)
        a = await fleet.start_one()
        jid = await q.enqueue("die_after_end", {})
        await fleet.wait_for("end", job=jid, attempt=1)
        assert a.wait(timeout=10) == -9
        b = fleet.spawn()
        res = await q.wait(jid, timeout=30)
        assert res == {"job": jid, "attempt": 2, "pid": b.pid}, fleet.dump()
        assert not fleet.events("fin", attempt=1)
        await fleet.wait_for("fin", job=jid)  # logged by the hook just after the commit
        assert len(fleet.events("fin", job=jid)) == 1

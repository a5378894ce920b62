"""Hung jobs: past its timeout a job is cancelled and counted as a failed attempt while its
worker keeps serving; a handler that blocks the whole event loop longer than lease_ttl is
reclaimed by another process, and its late result is fenced out."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from crashkit import Fleet, fleet_factory  # noqa: F401 - fixture

from aiojobqueue import JobContext, JobFailed, JobQueue, JobState


async def test_timeout_fails_the_attempt_and_the_worker_keeps_serving(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue()
    served: list[tuple[int, float]] = []

    @q.handler("hang", timeout=0.5, max_attempts=2)
    async def hang(ctx: JobContext) -> None:
        await asyncio.sleep(3600)

    @q.handler("quick")
    async def quick(ctx: JobContext, n: int) -> int:
        served.append((n, time.monotonic()))
        await asyncio.sleep(0.05)
        return n

    async with q:
        hid = await q.enqueue("hang", {})
        ids = [await q.enqueue("quick", {"n": n}) for n in range(10)]
        t0 = time.monotonic()
        serving = asyncio.create_task(q.serve())
        try:
            with pytest.raises(JobFailed) as ei:
                await q.wait(hid, timeout=20)
            failed_at = time.monotonic()
            assert [await q.wait(i, timeout=20) for i in ids] == list(range(10))
            # the worker served other jobs while the hung one was running (two attempts of
            # 0.5 s each), not only after it failed for good
            assert served and t0 < served[0][1] < failed_at
            late = await q.enqueue("quick", {"n": 99})  # and it still serves afterwards
            assert await q.wait(late, timeout=10) == 99
        finally:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
        job = await q.get(hid)
        assert job.attempts == 2 and job.state == JobState.FAILED
        assert ei.value.error["type"] == "TimeoutError"
        assert "timed out after 0.5s" in ei.value.error["message"]


@pytest.mark.slow
async def test_event_loop_blocker_is_reclaimed_and_its_late_result_discarded(
    make_queue: Callable[..., JobQueue], fleet_factory: Callable[..., Fleet]  # noqa: F811
) -> None:
    async with make_queue() as q:
        fleet = fleet_factory(ttl=2.0, hb=0.4)
        a = await fleet.start_one()
        jid = await q.enqueue("block", {"seconds": 6.0})  # attempt 1 freezes worker A
        await fleet.wait_for("start", job=jid, attempt=1, pid=a.pid)
        b = fleet.spawn()
        res = await q.wait(jid, timeout=30)
        assert res == {"job": jid, "attempt": 2, "pid": b.pid}, fleet.dump()
        # A wakes, finishes attempt 1 and tries to finalize: the fence discards it
        await fleet.wait_for("discarded", timeout=30, job=jid, attempt=1, pid=a.pid)
        end_a = fleet.events("end", job=jid, attempt=1)[0]
        fin = fleet.events("fin", job=jid)
        assert len(fin) == 1 and fin[0]["pid"] == b.pid and fin[0]["t"] < end_a["t"]
        job = await q.get(jid)
        assert job.state == JobState.DONE and job.attempts == 2
        assert job.result == res  # B's result stayed
        assert a.poll() is None  # A is alive and still serving
        nxt = await q.enqueue("sleep", {"seconds": 0.0})
        assert (await q.wait(nxt, timeout=20))["job"] == nxt

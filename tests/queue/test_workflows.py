"""Workflows (SPEC revision 3): fan-in through containers, snooze, external steps,
debounce, on every database."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from finalizekit import serving
from sqlalchemy import update

from aiojobqueue import InvalidJobError, JobContext, JobQueue, JobState, Snooze
from aiojobqueue.admin import now as _admin_now


async def admin_now(q: JobQueue) -> datetime:
    return await _admin_now(q)


async def test_fan_in_through_a_container_maps_leaf_ids_to_results(queue: JobQueue) -> None:
    got: dict[int, Any] = {}

    @queue.handler("fetch")
    async def fetch(ctx: JobContext, n: int) -> Any:
        return {"n": n}

    @queue.handler("merge")
    async def merge(ctx: JobContext) -> None:
        got.update(await ctx.dependency_results())

    async with queue.batch() as b:
        box = b.container("box")
        leaves = [b.add("fetch", {"n": n}, parent=box) for n in range(3)]
        inner = b.container("inner", parent=box)
        deep = [b.add("fetch", {"n": 10 + n}, parent=inner) for n in range(2)]
        empty = b.container("empty")
        plain = b.add("fetch", {"n": 99})
        b.add("merge", depends_on=[box, empty, plain])
    await queue.run_until_idle()
    want = {r.id: {"n": n} for n, r in enumerate(leaves)}
    want.update({r.id: {"n": 10 + n} for n, r in enumerate(deep)})
    assert got == {box.id: want, empty.id: {}, plain.id: {"n": 99}}
    assert all(isinstance(k, int) for k in got[box.id])


# -- snooze ---------------------------------------------------------------------------------


async def test_snooze_reschedules_without_using_an_attempt(queue: JobQueue) -> None:
    runs: list[float] = []

    @queue.handler("poll", max_attempts=1)
    async def poll(ctx: JobContext) -> str:
        runs.append(time.monotonic())
        if len(runs) < 3:
            raise Snooze(0.3)
        return "ok"

    jid = await queue.enqueue("poll")
    async with serving(queue):
        assert await queue.wait(jid, timeout=30) == "ok"
    job = await queue.get(jid)
    # three claims, one attempt allowed: the two snoozes used none
    assert (job.state, job.result, job.snoozes, job.attempts) == (JobState.DONE, "ok", 2, 3)
    assert job.max_attempts == 1 and job.error is None
    # never before its time (a lower bound: safe on a loaded machine)
    assert runs[1] - runs[0] >= 0.3 and runs[2] - runs[1] >= 0.3


async def test_snoozed_job_is_scheduled_for_that_long(queue: JobQueue) -> None:
    @queue.handler("later")
    async def later(ctx: JobContext) -> None:
        raise Snooze(timedelta(hours=1))

    jid = await queue.enqueue("later")
    await queue.run_until_idle()
    job = await queue.get(jid)
    assert job.state == JobState.SCHEDULED and job.snoozes == 1 and job.run_after is not None
    now = await admin_now(queue)
    assert timedelta(minutes=59) < job.run_after - now <= timedelta(hours=1)
    # a snooze is a delay, as run_after is: run_until_idle does not wait for it, and
    # another pass starts nothing
    await queue.run_until_idle()
    assert (await queue.get(jid)).snoozes == 1


def test_snooze_refuses_bad_seconds() -> None:
    for bad in (-1, float("nan"), float("inf"), "5", True, None, 10**9):
        with pytest.raises(InvalidJobError):
            Snooze(bad)  # type: ignore[arg-type]


async def test_snooze_of_an_attempt_that_lost_its_lease_changes_nothing(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue()
    stolen, go_on = asyncio.Event(), asyncio.Event()

    @q.handler("fenced")
    async def fenced(ctx: JobContext) -> None:
        stolen.set()
        await go_on.wait()
        raise Snooze(0)

    async with q:
        J = q._t.jobs
        jid = await q.enqueue("fenced")
        runner = asyncio.create_task(q.run_until_idle())
        await asyncio.wait_for(stolen.wait(), 30)
        # what a reclaim by another worker leaves: the row leased to someone else
        async with q.engine.begin() as conn:
            await conn.execute(update(J).where(J.c.id == jid)
                               .values(lease_owner="another-worker", attempts=J.c.attempts + 1))
        go_on.set()
        await asyncio.sleep(0.5)
        job = await q.get(jid)
        assert (job.state, job.lease_owner, job.snoozes) == (
            JobState.RUNNING, "another-worker", 0)
        async with q.engine.begin() as conn:  # let the run end
            await conn.execute(update(J).where(J.c.id == jid).values(state="done",
                                                                      lease_owner=None))
        await asyncio.wait_for(runner, 30)


async def test_cancel_requested_while_running_wins_over_a_snooze(queue: JobQueue) -> None:
    started, go_on = asyncio.Event(), asyncio.Event()

    @queue.handler("slow")
    async def slow(ctx: JobContext) -> None:
        started.set()
        await asyncio.shield(go_on.wait())
        raise Snooze(0)

    jid = await queue.enqueue("slow")
    runner = asyncio.create_task(queue.run_until_idle())
    await asyncio.wait_for(started.wait(), 30)
    await queue.cancel(jid)
    go_on.set()
    await asyncio.wait_for(runner, 30)
    assert (await queue.get(jid)).state == JobState.CANCELLED

"""Workflows (SPEC revision 3): fan-in through containers, snooze, external steps,
debounce, on every database."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import drop_tables, eventually
from finalizekit import serving
from sqlalchemy import func, select, update

from aiojobqueue import (
    InvalidJobError,
    InvalidStateError,
    JobContext,
    JobNotFoundError,
    JobQueue,
    JobState,
    NotJSONError,
    Snooze,
)
from aiojobqueue.admin import now as _admin_now

DEBOUNCER = Path(__file__).resolve().parents[1] / "debounceworker.py"


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


# -- external steps -------------------------------------------------------------------------


async def test_external_step_waits_for_complete_then_releases_dependents(
    queue: JobQueue,
) -> None:
    seen: dict[int, Any] = {}

    @queue.handler("work")
    async def work(ctx: JobContext) -> str:
        return "w"

    @queue.handler("after")
    async def after(ctx: JobContext) -> None:
        seen.update(await ctx.dependency_results())

    async with queue.batch() as b:
        first = b.add("work")
        box = b.container("box")
        approval = b.external(group="reviews", timeout=timedelta(hours=1), key="approve-1",
                              depends_on=[first], parent=box)
        nxt = b.add("after", depends_on=[approval, box])
    assert (await queue.get(approval.id)).state == JobState.WAITING
    await queue.run_until_idle()  # an external step is not in flight: this returns
    job = await queue.get(approval.id)
    assert job.state == JobState.EXTERNAL and job.is_external and job.group == "reviews"
    assert job.started_at is not None and job.attempts == 0
    assert (await queue.get(nxt.id)).state == JobState.WAITING
    # a second enqueue with the key finds the live step
    assert await queue.enqueue_external(key="approve-1") == approval.id
    await queue.complete(approval.id, {"ok": True})
    await queue.run_until_idle()
    assert (await queue.get(approval.id)).result == {"ok": True}
    assert (await queue.get(box.id)).state == JobState.DONE
    assert (await queue.get(nxt.id)).state == JobState.DONE
    assert seen == {approval.id: {"ok": True}, box.id: {approval.id: {"ok": True}}}


async def test_complete_twice_or_on_a_job_that_is_not_external_changes_nothing(
    queue: JobQueue,
) -> None:
    @queue.handler("work")
    async def work(ctx: JobContext) -> str:
        return "w"

    gate = await queue.enqueue("work", run_after=timedelta(hours=1))
    step = await queue.enqueue_external(depends_on=[gate])
    with pytest.raises(InvalidStateError, match="waiting for its dependencies"):
        await queue.complete(step, 1)
    with pytest.raises(InvalidStateError, match="not an external step"):
        await queue.complete(gate, 1)
    with pytest.raises(JobNotFoundError):
        await queue.fail(10**12)
    with pytest.raises(NotJSONError):
        await queue.complete(step, {1, 2})
    other = await queue.enqueue_external()
    await queue.complete(other, "first")
    before = await queue.get(other)
    with pytest.raises(InvalidStateError, match="already done"):
        await queue.complete(other, "second")
    with pytest.raises(InvalidStateError, match="already done"):
        await queue.fail(other, "late")
    assert await queue.get(other) == before


async def test_fail_cancels_dependents_and_retry_brings_the_step_back(queue: JobQueue) -> None:
    @queue.handler("work")
    async def work(ctx: JobContext) -> str:
        return "w"

    step = await queue.enqueue_external("payment", timeout=60)
    down = await queue.enqueue("work", depends_on=[step])
    await queue.fail(step, {"code": 402, "message": "declined"})
    s, d = await queue.get(step), await queue.get(down)
    assert s.state == JobState.FAILED and s.error == {
        "type": "ExternalFailed", "message": "declined", "code": 402}
    assert d.state == JobState.CANCELLED and d.cancelled_by == step
    await queue.retry(step)  # waits for the outside world again, with a fresh deadline
    assert (await queue.get(step)).state == JobState.EXTERNAL
    assert (await queue.get(down)).state == JobState.WAITING
    await queue.complete(step)
    await queue.run_until_idle()
    assert (await queue.get(down)).state == JobState.DONE


async def test_external_step_past_its_timeout_fails_once(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue()

    @q.handler("work")
    async def work(ctx: JobContext) -> str:
        return "w"

    async with q:
        step = await q.enqueue_external(timeout=0.3)
        down = await q.enqueue("work", depends_on=[step])
        keep = await q.enqueue_external(timeout=3600)
        async with serving(q):
            await eventually(lambda: _state(q, step, JobState.FAILED), timeout=20)
        job = await q.get(step)
        assert job.error is not None and job.error["type"] == "ExternalTimeout"
        assert (await q.get(down)).state == JobState.CANCELLED
        assert (await q.get(keep)).state == JobState.EXTERNAL
        with pytest.raises(InvalidStateError, match="already failed"):
            await q.complete(step, "too late")
        assert (await q.get(step)).error == job.error


async def _state(q: JobQueue, jid: int, state: JobState) -> bool:
    return (await q.get(jid)).state == state


async def test_cancel_of_an_external_step_and_of_its_upstream(queue: JobQueue) -> None:
    step = await queue.enqueue_external()
    await queue.cancel(step)
    assert (await queue.get(step)).state == JobState.CANCELLED
    gate = await queue.enqueue_external()
    step2 = await queue.enqueue_external(depends_on=[gate])
    await queue.fail(gate, "no")
    assert (await queue.get(step2)).state == JobState.CANCELLED


# -- debounce -------------------------------------------------------------------------------


async def test_debounce_coalesces_a_burst_into_one_run_with_the_last_args(
    queue: JobQueue,
) -> None:
    runs: list[int] = []

    @queue.handler("sync_user")
    async def sync_user(ctx: JobContext, v: int) -> int:
        runs.append(v)
        return v

    d = timedelta(seconds=0.6)
    first = await queue.enqueue("sync_user", {"v": 0}, key="u1", debounce=d)
    t0 = (await queue.get(first)).run_after
    for v in (1, 2, 3):
        assert await queue.enqueue("sync_user", {"v": v}, key="u1", debounce=d) == first
    job = await queue.get(first)
    assert job.args == {"v": 3} and job.state == JobState.SCHEDULED
    assert t0 is not None and job.run_after is not None and job.run_after > t0
    async with serving(queue):
        assert await queue.wait(first, timeout=30) == 3
    assert runs == [3]
    # the burst is over: the next enqueue starts a new one
    again = await queue.enqueue("sync_user", {"v": 4}, key="u1", debounce=d)
    assert again != first


async def test_debounce_never_moves_past_first_enqueue_plus_debounce_max(
    queue: JobQueue,
) -> None:
    first = await queue.enqueue("t", {"v": 0}, key="k", debounce=timedelta(seconds=60),
                                debounce_max=timedelta(seconds=5))
    created = (await queue.get(first)).created_at
    for v in range(3):
        await queue.enqueue("t", {"v": v}, key="k", debounce=60, debounce_max=5)
    job = await queue.get(first)
    assert job.run_after == created + timedelta(seconds=5)
    assert job.args == {"v": 2}


async def test_debounce_leaves_a_started_job_alone(queue: JobQueue) -> None:
    started, go_on = asyncio.Event(), asyncio.Event()

    @queue.handler("slow")
    async def slow(ctx: JobContext, v: int) -> int:
        started.set()
        await go_on.wait()
        return v

    jid = await queue.enqueue("slow", {"v": 1}, key="s", debounce=0)
    async with serving(queue):
        await asyncio.wait_for(started.wait(), 30)
        assert await queue.enqueue("slow", {"v": 2}, key="s", debounce=0) == jid
        assert (await queue.get(jid)).args == {"v": 1}
        go_on.set()
        assert await queue.wait(jid, timeout=30) == 1


async def test_debounce_refuses_bad_input_and_writes_nothing(queue: JobQueue) -> None:
    bad: list[dict[str, Any]] = [
        {"debounce": 1},  # no key
        {"debounce": 1, "key": "x", "run_after": 5},
        {"debounce": -1, "key": "x"},
        {"debounce": float("nan"), "key": "x"},
        {"debounce": "1", "key": "x"},
        {"debounce": 10, "debounce_max": -5, "key": "x"},
    ]
    for kw in bad:
        with pytest.raises(InvalidJobError):
            await queue.enqueue("t", {}, **kw)
    async with queue.engine.connect() as conn:
        n = (await conn.execute(select(func.count()).select_from(queue._t.jobs))).scalar_one()
    assert n == 0


async def test_racing_debounced_enqueues_from_several_processes_run_once(
    make_queue: Callable[..., JobQueue], db_url: str, prefix: str, tmp_path: Any,
) -> None:
    """4 processes enqueue the same key 25 times each, all at once: one job, one run,
    every id returned is that job's, and it runs with the args one enqueue wrote."""
    q = make_queue()
    runs: list[dict[str, Any]] = []

    @q.handler("bump")
    async def bump(ctx: JobContext, tag: str, i: int) -> None:
        runs.append({"tag": tag, "i": i})

    async with q:  # the schema exists before the processes start
        go = tmp_path / "go"
        env = {**os.environ, "PYTHONPATH": str(DEBOUNCER.parent)}
        procs = [subprocess.Popen(  # noqa: ASYNC220 - started at once, waited for below
            [sys.executable, str(DEBOUNCER), db_url, prefix, str(go), f"p{k}", "25"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for k in range(4)]
        go.touch()
        outs = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0] * 4, [e for _, e in outs]
        ids = {int(line) for out, _ in outs for line in out.split()}
        assert len(ids) == 1
        (jid,) = ids
        job = await q.get(jid)
        # one process's args (whichever enqueue wrote last), whole
        assert job.args["tag"] in {f"p{k}" for k in range(4)} and 0 <= job.args["i"] < 25
        assert job.state == JobState.SCHEDULED
        async with serving(q):
            await q.wait(jid, timeout=30)
            await asyncio.sleep(0.5)
        assert runs == [job.args]
        async with q.engine.connect() as conn:
            n = (await conn.execute(select(func.count()).select_from(q._t.jobs))).scalar_one()
        assert n == 1


async def test_explain_says_why_an_external_step_has_not_started(queue: JobQueue) -> None:
    step = await queue.enqueue_external("approval", timeout=timedelta(hours=2))
    e = await queue.explain(step)
    assert e.codes == ["external"] and e.state == JobState.EXTERNAL
    assert "complete() or fail()" in str(e) and "unless completed" in str(e)
    assert e.reasons[0].data["deadline"] is not None
    forever = await queue.enqueue_external()
    assert "no timeout" in str(await queue.explain(forever))
    gated = await queue.enqueue_external(depends_on=[step])
    e = await queue.explain(gated)
    assert e.codes == ["waiting_on"] and e.reasons[0].data["ids"] == [step]


def test_sync_queue_completes_and_fails_external_steps(db_url: str, prefix: str) -> None:
    """A webhook view in synchronous code (Django, Flask): SyncQueue's calls."""
    try:
        _sync_calls(db_url, prefix)
    finally:
        if not db_url.startswith("sqlite"):
            asyncio.run(drop_tables(db_url, prefix))


def _sync_calls(db_url: str, prefix: str) -> None:
    from aiojobqueue import SyncQueue

    with SyncQueue(db_url, prefix=prefix) as q:
        with q.batch() as b:
            step = b.external("approval", timeout=60)
            after = b.add("next", depends_on=[step])
        other = q.enqueue_external("review")
        q.complete(step.id, {"ok": True})
        with pytest.raises(InvalidStateError, match="already done"):
            q.complete(step.id, {"ok": False})
        q.fail(other, "no")
        assert q.get(step.id).result == {"ok": True}
        assert q.get(after.id).state == JobState.READY
        assert q.get(other).state == JobState.FAILED


def test_sync_queue_enqueue_takes_when_and_debounce(db_url: str, prefix: str) -> None:
    """SyncQueue.enqueue (and SyncBatch.add) take the run condition and debounce, as
    JobQueue.enqueue does; debounce refuses a caller's connection."""
    try:
        _sync_when_and_debounce(db_url, prefix)
    finally:
        if not db_url.startswith("sqlite"):
            asyncio.run(drop_tables(db_url, prefix))


def _sync_when_and_debounce(db_url: str, prefix: str) -> None:
    from aiojobqueue import ConfigurationError, SyncQueue

    with SyncQueue(db_url, prefix=prefix) as q:
        step = q.enqueue_external("approval")
        cleanup = q.enqueue("cleanup", depends_on=[step], when="failed")
        with q.batch() as b:
            always = b.add("report", depends_on=[step], when="finished")
        assert q.get(cleanup).state == JobState.WAITING
        q.fail(step, "refused")
        assert q.get(cleanup).state == JobState.READY  # runs because the step failed
        assert q.get(always.id).state == JobState.READY
        first = q.enqueue("ping", {"n": 1}, key="ping", debounce=30)
        again = q.enqueue("ping", {"n": 2}, key="ping", debounce=30)
        assert again == first and q.get(first).args == {"n": 2}
        with q.engine.begin() as conn, pytest.raises(ConfigurationError, match="debounce"):
            q.enqueue("ping", {"n": 3}, key="ping", debounce=30, connection=conn)
        assert q.get(first).args == {"n": 2}

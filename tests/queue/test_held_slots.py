"""Held slots under a counted cap (issue 18): a hand-over may also lease jobs ahead into the
state ``leased``, which no cap counts and no other claim sees; the worker starts one only in
a slot of its own whose job ended, and the transaction that writes that job's outcome makes
the held row ``running`` first (Finalizer.swap_in). What must hold: the caps' count never
grows by a hold, a swap keeps it as it was, a dead worker's held rows come back, and held
jobs are given back at shutdown (not counted as an attempt)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

from sqlalchemy import func, select, update

from aiojobqueue import JobContext, JobQueue, JobState
from aiojobqueue.claimed import Claimed, Hold
from aiojobqueue.finalize import Outcome
from aiojobqueue.timeutil import utcnow_plus

LEASED, RUNNING = JobState.LEASED.value, JobState.RUNNING.value


async def _states(q: JobQueue) -> Counter[str]:
    J = q._t.jobs

    async def read(conn: Any) -> Counter[str]:
        rows = await conn.execute(select(J.c.state, func.count()).group_by(J.c.state))
        return Counter({r[0]: int(r[1]) for r in rows})

    return await q._read(read)


async def test_a_hold_is_counted_by_no_cap_and_a_swap_keeps_the_count(
    make_queue: Callable[..., JobQueue],
) -> None:
    """concurrency=3, 3 running. One transaction finishes 2 and hands their slots over,
    holding 5 more ahead: still 3 running, 5 leased, and another worker's gated claim finds
    the cap full. Then one transaction makes a held job running and finishes the job whose
    slot it took: 3 running, 4 leased."""
    q = make_queue(concurrency=3, capacity=3, poll_interval=5.0)
    other = make_queue(concurrency=3, capacity=3, poll_interval=5.0)
    async with q, other:
        async with q.batch() as b:
            for _ in range(20):
                b.add("t", {}, group="g")
        core = q._core
        got = await q._write(lambda conn: core.claimer.claim(conn, 10, ["t"]))
        assert len(got) == 3 and core.claimer.single_group == "g"
        hold = Hold(limit=6, slots=3, have=0)

        async def hand_over(conn: Any) -> list[Claimed]:
            applied = await core.finalizer.finish_detailed(
                conn, [Outcome(c.id, c.attempt, q.worker_id, "done") for c in got[:2]])
            return await core.claimer.claim(conn, 2, ["t"], quick=True,
                                            freed={"g": len(applied)}, hold=hold)

        took = await q._write(hand_over)
        assert len(took) == 2
        assert len(hold.got) == 5  # min(limit 6, its 3 slots + the 2 just leased)
        assert (await _states(q))[RUNNING] == 3
        assert (await _states(q))[LEASED] == 5
        # no other claim sees them, and the cap is full as far as any claim counts
        assert await other._write(lambda conn: other._core.claimer.claim(conn, 3, ["t"])) == []

        ended, swapped = got[2], hold.got[0]

        async def swap(conn: Any) -> list[Outcome]:
            await core.finalizer.swap_in(conn, [(swapped.id, swapped.attempt)])
            return await core.finalizer.finish_detailed(
                conn, [Outcome(ended.id, ended.attempt, q.worker_id, "done",
                               swap=(swapped.id, swapped.attempt))])

        assert len(await q._write(swap)) == 1
        states = await _states(q)
        assert states[RUNNING] == 3 and states[LEASED] == 4
        assert (await q.get(swapped.id)).state == JobState.RUNNING
        # a held job finishes as any running one (fenced by its attempt and owner)
        done = await q._write(lambda conn: core.finalizer.finish_detailed(
            conn, [Outcome(swapped.id, swapped.attempt, q.worker_id, "done")]))
        assert len(done) == 1 and (await q.get(swapped.id)).state == JobState.DONE


async def test_a_capped_drain_holds_jobs_ahead_and_never_exceeds_the_cap(
    make_queue: Callable[..., JobQueue],
) -> None:
    """One worker, capacity 4, concurrency=4, 300 short jobs: it holds jobs ahead (leased
    rows seen), never runs more than 4 at once, never counts more than 4 running in the
    database, and every job runs once."""
    q = make_queue(concurrency=4, capacity=4)
    live, most = 0, 0
    ran: Counter[int] = Counter()

    @q.handler("t")
    async def t(ctx: JobContext) -> None:
        nonlocal live, most
        live += 1
        most = max(most, live)
        ran[ctx.job_id] += 1
        await asyncio.sleep(0.001)
        live -= 1

    seen: Counter[str] = Counter()
    peak_running = 0
    stop = asyncio.Event()

    async def sample() -> None:
        nonlocal peak_running
        while not stop.is_set():
            st = await _states(q)
            peak_running = max(peak_running, st[RUNNING])
            seen[LEASED] = max(seen[LEASED], st[LEASED])
            await asyncio.sleep(0.002)

    async with q:
        async with q.batch() as b:
            refs = [b.add("t", {}, group="g") for _ in range(300)]
        sampler = asyncio.create_task(sample())
        await q.run_until_idle()
        stop.set()
        await sampler
        states = await _states(q)
    assert states == Counter({JobState.DONE.value: 300})
    assert sorted(ran) == sorted(r.id for r in refs) and set(ran.values()) == {1}
    assert most == 4 and peak_running <= 4
    assert seen[LEASED] > 0


async def test_a_dead_workers_held_rows_are_reclaimed(
    make_queue: Callable[..., JobQueue],
) -> None:
    """Rows a worker that died held ahead (``leased``, lease expired) are reclaimed by a
    live worker: the attempt counts as failed (it may have started in a freed slot), and
    the job runs again."""
    q = make_queue(concurrency=2, capacity=2)
    ran: list[int] = []

    @q.handler("t")
    async def t(ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    async with q:
        async with q.batch() as b:
            refs = [b.add("t", {}, group="g", max_attempts=3) for _ in range(3)]
        J = q._t.jobs
        ids = [r.id for r in refs]
        await q._write(lambda conn: conn.execute(update(J).where(J.c.id.in_(ids)).values(
            state=LEASED, lease_owner="dead-worker", attempts=1,
            lease_expires=utcnow_plus(-5.0))))
        await q.run_until_idle()
        for jid in ids:
            j = await q.get(jid)
            assert j.state == JobState.DONE and j.attempts == 2
            assert [e["type"] for e in j.errors or []] == ["LeaseExpired"]
    assert sorted(ran) == sorted(ids)


async def test_held_jobs_are_given_back_at_shutdown(
    make_queue: Callable[..., JobQueue],
) -> None:
    """A worker that holds jobs ahead and stops gives them back: ready again at once, the
    attempt not counted against max_attempts; nothing is left leased or running."""
    q = make_queue(concurrency=2, capacity=2)
    gate = asyncio.Event()

    @q.handler("t")
    async def t(ctx: JobContext, block: bool = False) -> None:
        if block:
            await gate.wait()

    async with q:
        async with q.batch() as b:
            quick = [b.add("t", {}, group="g", priority=1) for _ in range(2)]
            slow = [b.add("t", {"block": True}, group="g", max_attempts=1) for _ in range(20)]
        served = asyncio.create_task(q.serve())
        try:
            from conftest import eventually

            async def holding() -> bool:
                st = await _states(q)
                return st[LEASED] > 0 and st[RUNNING] == 2

            await eventually(holding, timeout=10)
        finally:
            served.cancel()
            await asyncio.gather(served, return_exceptions=True)
        states = await _states(q)
        assert states[LEASED] == 0 and states[RUNNING] == 0
        assert states[JobState.DONE.value] == len(quick)
        assert states[JobState.READY.value] == len(slow)
        for r in slow:  # released: its attempt does not count (max_attempts=1 still runs)
            j = await q.get(r.id)
            assert j.state == JobState.READY
        gate.set()
        await q.run_until_idle()
        for r in slow:
            assert (await q.get(r.id)).state == JobState.DONE

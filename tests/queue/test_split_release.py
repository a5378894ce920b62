"""The split release of a wide fan-out (PostgreSQL, see fanout.SPLIT): at a DAG step, the
finalize call of a job that many jobs wait on releases only the first of them (and leases
some) and records the rest in the releases table in the same transaction; a call of its own
releases the rest right after, and a row that a worker left behind (it died, or that call
failed) is finished by any worker's sweep.

What must hold: every dependent runs once, after its upstream and before what waits on it;
nothing stays waiting once its upstream is done, whoever dies when; ``run_until_idle`` does
not return while a split is unfinished; a retry in between does not take an edge off twice.
The tests lower the split (``fanout.SPLIT``) so that small fan-outs are split."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from conftest import eventually
from crashkit import Fleet, fleet_factory  # noqa: F401 - fixture
from finalizekit import serving
from sqlalchemy import func, select

import aiojobqueue.claim as claim_mod
from aiojobqueue import JobContext, JobQueue, JobState, admin, fanout
from aiojobqueue.fanout import SplitReleases
from aiojobqueue.worker import leases

PG_ONLY = pytest.mark.parametrize("db", ["postgresql"], indirect=True)
WIDE = 40


@pytest.fixture
def steady(monkeypatch: pytest.MonkeyPatch) -> None:
    """No promotion sweep or group census due during a test (with poll_interval=60), so the
    finalize of the head always leases along: the case where its release is split."""
    monkeypatch.setattr(claim_mod, "LOOK_EVERY", 60.0)


def split_queue(make_queue: Callable[..., JobQueue], monkeypatch: pytest.MonkeyPatch,
                hold_rest: bool = False, **kw: Any) -> tuple[JobQueue, list[int]]:
    """A queue whose fan-outs of more than max(4 x its lease, 4) jobs are split, and the
    number of parts each rest-release call released (a spy: the calls run unchanged).
    ``hold_rest``: the call releasing the rest right after a split never runs, nor does the
    reclaimer (its sweep would take the part as soon as it sees it, maybe before the test
    does); run_until_idle's own look still does. Steady (see there) on
    PostgreSQL."""
    monkeypatch.setattr(fanout, "SPLIT", 4)
    done: list[int] = []
    real = SplitReleases.rest_releases

    async def spy(self: SplitReleases, n: int = 8) -> int:
        got = await real(self, n)
        done.append(got)
        return got

    monkeypatch.setattr(SplitReleases, "rest_releases", spy)
    if hold_rest:
        monkeypatch.setattr(SplitReleases, "release_rest", lambda self: None)
        monkeypatch.setattr(leases.Reclaimer, "run", _no_sweep)
    return make_queue(**kw), done


async def _no_sweep(self: leases.Reclaimer) -> None:
    await asyncio.Event().wait()  # (no lease expires in these tests)


async def releases_left(q: JobQueue) -> int:
    R = q._t.releases
    return int(await q._read(lambda conn: conn.scalar(select(func.count()).select_from(R)))
               or 0)


def fan(b: Any, kind: str = "t", n: int = WIDE) -> tuple[Any, list[Any], Any]:
    head = b.add(kind, {"name": "head"})
    outs = [b.add(kind, {"name": f"out{i}"}, depends_on=[head]) for i in range(n)]
    tail = b.add(kind, {"name": "tail"}, depends_on=outs)
    return head, outs, tail


async def drain_fan(q: JobQueue) -> None:
    """Run fan()'s head -> WIDE jobs -> tail on ``q`` until idle: each job done, once, after
    the head and before the tail; nothing left in the releases table."""
    order: list[str] = []

    @q.handler("t")
    async def t(ctx: JobContext, name: str) -> None:
        order.append(name)

    async with q:
        async with q.batch() as b:
            head, outs, tail = fan(b)
        await q.run_until_idle()
        for ref in (head, *outs, tail):
            job = await q.get(ref.id)
            assert job.state == JobState.DONE and job.attempts == 1, (ref.id, job.state)
        assert await releases_left(q) == 0
    assert order[0] == "head" and order[-1] == "tail", order
    assert sorted(order[1:-1]) == sorted(f"out{i}" for i in range(WIDE))


async def test_a_wide_fan_out_runs_once_each_in_order(
    make_queue: Callable[..., JobQueue], db: str, steady: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """head -> 40 jobs -> tail at capacity 2: the head's finalize releases 8 (or 4, see
    below) on PostgreSQL, the others follow in a call of their own; on SQLite and MariaDB
    all 40 are released by the finalize. Either way each runs once, after the head and
    before the tail, and nothing is left in the releases table."""
    q, rests = split_queue(make_queue, monkeypatch, capacity=2, poll_interval=60.0)
    await drain_fan(q)
    if db == "postgresql":
        assert sum(rests) >= 1, rests  # the fan-out was split, its rest released apart
    else:
        assert sum(rests) == 0, rests


@PG_ONLY
async def test_the_finalize_releases_the_first_part_and_records_the_rest(
    make_queue: Callable[..., JobQueue], steady: None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seen from the database right after the head's finalize, with the call that would
    release the rest held back: max(4 x 2, 4) = 8 dependents released (2 of them leased by
    the same call; 4 where the flusher wrote the head's outcome, leasing nothing), the first
    in claim order, the others still waiting, and one part holding exactly those; the sweep
    then releases them all and empties the table."""
    q, _ = split_queue(make_queue, monkeypatch, hold_rest=True, capacity=2, poll_interval=60.0)
    ran = asyncio.Event()

    @q.handler("t")
    async def t(ctx: JobContext, name: str) -> None:
        if name == "head":
            ran.set()
        else:
            await asyncio.sleep(3600)  # the first dependents stay leased

    async with q:
        async with q.batch() as b:
            head, outs, _tail = fan(b)
        async with serving(q):
            await eventually(lambda: releases_left(q))
            states = {ref.id: (await q.get(ref.id)).state for ref in outs}
            released = [i for i, s in states.items() if s != JobState.WAITING]
            # max(4 x 2, 4) where the call leased 2 along, max(0, 4) where it leased none
            assert len(released) in (8, 4), states
            assert sorted(released) == sorted(ref.id for ref in outs)[:len(released)]
            R = q._t.releases
            row = (await q._read(lambda conn: conn.execute(select(R.c.job_id, R.c.ids)))).one()
            assert row.job_id == head.id
            assert sorted(row.ids) == sorted(i for i, s in states.items()
                                             if s == JobState.WAITING)
            assert (await admin.status(q)).releasing == 1  # `aiojobqueue status` shows it
            assert await q._started().splits.rest_releases() == 1
            assert await releases_left(q) == 0
            assert (await admin.status(q)).releasing == 0
            for ref in outs:
                assert (await q.get(ref.id)).state != JobState.WAITING
    assert ran.is_set()


@PG_ONLY
async def test_run_until_idle_finishes_a_split_it_was_left(
    make_queue: Callable[..., JobQueue], steady: None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The call releasing the rest never runs (as if it failed): run_until_idle() must not
    return with jobs waiting on a done upstream. Its idle check finds the row and releases
    the rest itself; everything runs."""
    q, rests = split_queue(make_queue, monkeypatch, hold_rest=True, capacity=2,
                           poll_interval=60.0)
    await drain_fan(q)
    assert sum(rests) >= 1, rests


@PG_ONLY
async def test_retry_while_a_split_is_pending_does_not_take_an_edge_off_twice(
    make_queue: Callable[..., JobQueue], steady: None, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A recorded dependent also waits on ``gate``, which never finishes here. It is
    cancelled and retried before the rest is released: the retry counts its edges afresh
    (the head's no longer counts) and takes it out of the recorded rest, so the release of
    the rest leaves it waiting on ``gate``, not runnable."""
    q, _ = split_queue(make_queue, monkeypatch, hold_rest=True, capacity=2, poll_interval=60.0)

    @q.handler("t")
    async def t(ctx: JobContext, name: str) -> None:
        if name != "head":
            await asyncio.sleep(3600)

    async with q:
        async with q.batch() as b:
            gate = b.add("never", {})
            head = b.add("t", {"name": "head"})
            outs = [b.add("t", {"name": f"out{i}"}, depends_on=[head]) for i in range(WIDE)]
            late = b.add("t", {"name": "late"}, depends_on=[head, gate])
        async with serving(q):
            await eventually(lambda: releases_left(q))
            assert (await q.get(late.id)).state == JobState.WAITING
            await q.cancel(late.id)
            await q.retry(late.id)
            assert (await q.get(late.id)).state == JobState.WAITING
            assert await q._started().splits.rest_releases() == 1
            job = await q.get(late.id)
            assert job.state == JobState.WAITING, job.state  # still on gate
            for ref in outs:
                assert (await q.get(ref.id)).state != JobState.WAITING


@PG_ONLY
@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_split_left_by_a_killed_worker_is_finished_by_another(
    make_queue: Callable[..., JobQueue], fleet_factory: Callable[..., Fleet],  # noqa: F811
) -> None:
    """Worker A finalizes the head and records the rest of its fan-out, then never releases
    it (``--stall-rest``) and is SIGKILLed while it runs the first part. Worker B, started
    after the kill, releases the rest by its sweep: every job of the fan-out and the tail
    end done, each after its upstream, the releases table empty."""
    async with make_queue() as q:
        async with q.batch() as b:
            head = b.add("sleep", {"seconds": 0.0})
            outs = [b.add("sleep", {"seconds": 30.0}, depends_on=[head]) for _ in range(WIDE)]
            tail = b.add("sleep", {"seconds": 0.0}, depends_on=outs)
        fleet = fleet_factory(capacity=2, ttl=2.0, hb=0.4)
        a = await fleet.start_one(split=4, stall_rest=1)
        await fleet.wait_for("split", pid=a.pid)
        await fleet.wait_for("start", job=outs[0].id, pid=a.pid)
        assert await releases_left(q) == 1
        fleet.kill(a)
        # the rest is still recorded and its jobs still waiting: nobody has released them
        waiting = [ref.id for ref in outs if (await q.get(ref.id)).state == JobState.WAITING]
        assert len(waiting) in (WIDE - 8, WIDE - 4), waiting
        J = q._t.jobs
        await q._write(lambda conn: conn.execute(  # shorten the fan-out: B runs it at once
            J.update().where(J.c.id.in_([r.id for r in outs])).values(
                args={"seconds": 0.0})))
        b_proc = await fleet.start_one(capacity=8)
        await eventually(lambda: _done(q, tail.id), timeout=60)
        assert await releases_left(q) == 0
        starts = {e["job"]: e for e in fleet.events("start") if e["pid"] == b_proc.pid}
        ends = {(e["job"], e["attempt"]): e["t"] for e in fleet.events("end")}
        head_end = ends[(head.id, 1)]
        for ref in outs:
            job = await q.get(ref.id)
            assert job.state == JobState.DONE
            assert min(e["t"] for e in fleet.events("start", job=ref.id)) >= head_end
        last_out = max([ends[(ref.id, (await q.get(ref.id)).attempts)] for ref in outs])
        assert starts[tail.id]["t"] >= last_out
        assert all(starts.get(i) for i in waiting), "B ran the jobs A left recorded"


async def _done(q: JobQueue, job_id: int) -> bool:
    return (await q.get(job_id)).state == JobState.DONE


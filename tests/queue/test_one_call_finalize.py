"""The one-call finalize (PostgreSQL): a success of a job with dependents or a parent is
finalized, and its dependents released, by one call of a server-side routine in autocommit.

What must hold: the routine's release reads edges committed while its UPDATE waited for the
job's row lock (a single statement's snapshot would not); it declines, changing nothing,
where a container must be activated or rolled up (the long path does those); a lost answer
neither re-runs nor double-finalizes; without the routine the long path does the same."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
from conftest import eventually
from finalizekit import serving, watched_queue
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from tcpproxy import TcpProxy

import aiojobqueue.claim as claim_mod
from aiojobqueue import JobContext, JobQueue, JobState
from aiojobqueue.claim import Claimer
from aiojobqueue.claimed import Claimed, LeaseAsk
from aiojobqueue.finalize import Finalizer, Outcome
from aiojobqueue.schema import build_tables

PG_ONLY = pytest.mark.parametrize("db", ["postgresql"], indirect=True)


@pytest.fixture
def one_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[int], set[int]]]:
    """Each call of Finalizer.finish_in_one_call: (ids given, ids it finished). A spy on
    which path a finalize took; the calls themselves run unchanged against the database."""
    seen: list[tuple[list[int], set[int]]] = []
    real = Finalizer.finish_in_one_call

    async def spy(self: Finalizer, conn: Any, outcomes: Any,
                  ask: Any = None) -> set[tuple[int, int]]:
        took = await real(self, conn, outcomes, ask)
        seen.append(([o.job_id for o in outcomes], {i for i, _ in took}))
        return took

    monkeypatch.setattr(Finalizer, "finish_in_one_call", spy)
    return seen


async def test_edge_added_while_a_job_with_dependents_finalizes_is_released(
    make_queue: Callable[..., JobQueue], db: str,
    one_calls: list[tuple[list[int], set[int]]],
) -> None:
    """x has a dependent z (so it is not finished by the one-statement path). While x's
    finalize waits for x's row lock, another transaction adds y -> x and commits: y must be
    released with z. On PostgreSQL this is the routine's case: one statement doing both the
    UPDATE and the release would read the edges with a snapshot from before y's commit."""
    observer, q = make_queue(), make_queue()
    started, go = asyncio.Event(), asyncio.Event()
    order: list[str] = []

    @q.handler("x")
    async def x(ctx: JobContext) -> None:
        started.set()
        await go.wait()
        order.append("x")

    @q.handler("after")
    async def after(ctx: JobContext, name: str) -> None:
        order.append(name)

    async with observer, q:
        async with observer.batch() as b:
            xref = b.add("x", {})
            zref = b.add("after", {"name": "z"}, depends_on=[xref])
        async with serving(q):
            await asyncio.wait_for(started.wait(), 15)
            async with observer.engine.begin() as conn:
                # the edge is written and x's row locked in this open transaction ...
                async with observer.batch(connection=conn) as b:
                    yref = b.add("after", {"name": "y"}, depends_on=[xref.id])
                go.set()  # ... while x finishes: its finalize waits for this lock
                await asyncio.sleep(0.5)
            assert await observer.wait(yref.id, timeout=15) is None
            assert await observer.wait(zref.id, timeout=15) is None
        assert order[0] == "x" and sorted(order[1:]) == ["y", "z"], order
        if db == "postgresql":  # the case above went through the routine
            assert any(xref.id in took for _, took in one_calls), one_calls


async def test_last_children_roll_their_containers_up_and_release_what_waits(
    make_queue: Callable[..., JobQueue], db: str,
    one_calls: list[tuple[list[int], set[int]]],
) -> None:
    """The last child of an inner container, itself the last child of an outer one: both
    roll up, and the next container (waiting on the outer one) is activated and runs its
    children, in order. On PostgreSQL the routine does all of it in the child's call."""
    q = make_queue()
    order: list[str] = []
    gate = asyncio.Event()

    @q.handler("step")
    async def step(ctx: JobContext, name: str) -> None:
        if name == "last":
            await gate.wait()
        order.append(name)

    async with q:
        async with q.batch() as b:
            outer = b.container("outer")
            inner = b.container("inner", parent=outer)
            first = b.add("step", {"name": "first"}, parent=inner)
            last = b.add("step", {"name": "last"}, parent=inner, depends_on=[first])
            nxt = b.container("next", depends_on=[outer])
            head = b.add("step", {"name": "head"}, parent=nxt)
            tail = b.add("step", {"name": "tail"}, parent=nxt, depends_on=[head])
        async with serving(q):
            assert await q.wait(first.id, timeout=15) is None
            assert (await q.get(inner.id)).state == JobState.ACTIVE
            assert (await q.get(nxt.id)).state == JobState.WAITING
            gate.set()
            assert await q.wait(tail.id, timeout=15) is None
        assert order == ["first", "last", "head", "tail"]
        for box in (inner, outer, nxt):
            assert (await q.get(box.id)).state == JobState.DONE
    if db == "postgresql":
        took = {i for _, t in one_calls for i in t}
        assert {first.id, last.id, head.id, tail.id} <= took, one_calls


@PG_ONLY
async def test_the_routine_declines_a_failed_roll_up_and_changes_nothing(
    make_queue: Callable[..., JobQueue], one_calls: list[tuple[list[int], set[int]]],
) -> None:
    """A container whose other child failed: the last child's call declines (the failure
    and the cancellation of what waits on the container are the long path's), leaving
    nothing half done; the long path then fails the container and cancels its dependent."""
    q = make_queue()
    gate = asyncio.Event()

    @q.handler("bad")
    async def bad(ctx: JobContext) -> None:
        raise RuntimeError("no")

    @q.handler("last")
    async def last_(ctx: JobContext) -> None:
        await gate.wait()

    @q.handler("after")
    async def after_(ctx: JobContext) -> None:
        return None

    async with q:
        async with q.batch() as b:
            box = b.container("box")
            a = b.add("bad", {}, parent=box, max_attempts=1)
            z = b.add("last", {}, parent=box)
            after = b.add("after", {}, depends_on=[box])
        async with serving(q):
            await eventually(lambda: _state(q, a.id, JobState.FAILED))
            assert (await q.get(box.id)).state == JobState.ACTIVE
            gate.set()
            await eventually(lambda: _state(q, after.id, JobState.CANCELLED))
        assert (await q.get(box.id)).state == JobState.FAILED
        assert (await q.get(z.id)).state == JobState.DONE
    given = {i for ids, _ in one_calls for i in ids}
    took = {i for _, t in one_calls for i in t}
    assert z.id in given and z.id not in took  # declined: the long path finished it


async def _state(q: JobQueue, job_id: int, state: str) -> bool:
    return bool((await q.get(job_id)).state == state)


@PG_ONLY
async def test_one_call_finalize_whose_answer_was_lost_is_finalized_once(
    make_queue: Callable[..., JobQueue], db_url: str, prefix: str,
    caplog: pytest.LogCaptureFixture, one_calls: list[tuple[list[int], set[int]]],
) -> None:
    """The routine's call commits, then its answer is lost: the job is not run again, not
    finalized twice, its dependent runs once, and it is reported done."""
    caplog.set_level(logging.WARNING, "aiojobqueue")
    async with make_queue() as observer, TcpProxy.for_url(db_url) as px:
        q, events = watched_queue(px.url(db_url), prefix)
        calls: list[str] = []

        @q.handler("step")
        async def step(ctx: JobContext, name: str) -> None:
            calls.append(name)
            if name == "up":
                px.cut_after_statement(b"_settle_")  # the routine's call

        async with observer.batch() as b:
            up = b.add("step", {"name": "up"})
            down = b.add("step", {"name": "down"}, depends_on=[up])
        async with q, serving(q):
            assert await observer.wait(down.id, timeout=30) is None
            await asyncio.sleep(0.5)  # let any stray second run or finalize show itself
        assert px.ambiguous_commits == 1, "the fault was not injected"
        job = await observer.get(up.id)
        assert job.state == JobState.DONE and job.attempts == 1
        assert calls == ["up", "down"] and events == ["done", "done"], (calls, events)
        assert "committed though its answer was lost" in caplog.text


@PG_ONLY
async def test_without_the_routine_the_long_path_finalizes(
    make_queue: Callable[..., JobQueue], db_url: str, prefix: str,
    caplog: pytest.LogCaptureFixture, one_calls: list[tuple[list[int], set[int]]],
) -> None:
    """A queue started without migrating, on a database whose routine is missing, says so
    and runs DAGs through the long path; ``migrate`` (start()) installs the routine, and
    dropping the tables drops it too."""
    async with make_queue():
        pass  # schema and routine
    engine = create_async_engine(db_url)
    routines = (text("SELECT count(*) FROM pg_proc WHERE proname LIKE :p"),
                {"p": f"{prefix}jobs_settle_%"})
    try:
        async with engine.begin() as conn:
            assert (await conn.execute(*routines)).scalar() == 3  # finalize, release, rest
            await conn.exec_driver_sql(
                "DO $$ DECLARE f regprocedure; BEGIN FOR f IN SELECT oid::regprocedure FROM "
                f"pg_proc WHERE proname LIKE '{prefix}jobs_settle_%' LOOP "
                "EXECUTE 'DROP FUNCTION ' || f; END LOOP; END $$")
        caplog.set_level(logging.INFO, "aiojobqueue")
        q = make_queue()
        order: list[str] = []

        @q.handler("step")
        async def step(ctx: JobContext, name: str) -> None:
            order.append(name)

        await q.start(migrate=False)
        core = q._core
        assert core is not None and core.finalizer.settle_call is None
        assert core.settler.path.release_call is None and core.splits.rest_call is None
        assert "is missing (run `aiojobqueue migrate`)" in caplog.text
        async with q.batch() as b:
            ups = [b.add("step", {"name": "up"}) for _ in range(3)]
            down = b.add("step", {"name": "down"}, depends_on=ups)
        await q.run_until_idle()
        assert order == ["up"] * 3 + ["down"]
        assert (await q.get(down.id)).state == JobState.DONE
        assert one_calls == []
        await q.close()
        async with make_queue() as again:
            core = again._core
            assert core is not None and core.finalizer.settle_call is not None
            assert core.settler.path.release_call is not None
            assert core.splits.rest_call is not None
        async with engine.begin() as conn:
            assert (await conn.execute(*routines)).scalar() == 3
            await conn.run_sync(build_tables(prefix).metadata.drop_all)
            assert (await conn.execute(*routines)).scalar() == 0
    finally:
        await engine.dispose()


async def test_results_are_stored_by_the_one_call_path(
    make_queue: Callable[..., JobQueue], db: str,
    one_calls: list[tuple[list[int], set[int]]],
) -> None:
    """Jobs that return results, finished together (some returning None), store each its
    own result (None as no result), and a dependent reads them; on PostgreSQL through the
    routine, in one call."""
    q = make_queue()
    gate = asyncio.Event()
    values: dict[int, Any] = {0: None, 1: {"a": [1, 2.5, "x"]}, 2: "text", 3: 7, 4: None,
                              5: [None, True], 6: {"nested": {"null": None}}}

    @q.handler("emit")
    async def emit(ctx: JobContext, i: int) -> Any:
        await gate.wait()  # finish together: one finalize batch
        return values[i]

    seen: dict[int, Any] = {}

    @q.handler("read")
    async def read(ctx: JobContext) -> None:
        seen.update(await ctx.dependency_results())

    async with q:
        async with q.batch() as b:
            ups = {i: b.add("emit", {"i": i}) for i in values}
            down = b.add("read", {}, depends_on=list(ups.values()))
        async with serving(q):
            await asyncio.sleep(0.3)
            gate.set()
            assert await q.wait(down.id, timeout=15) is None
        for i, ref in ups.items():
            job = await q.get(ref.id)
            assert job.state == JobState.DONE and job.result == values[i], (i, job.result)
        assert seen == {ref.id: values[i] for i, ref in ups.items()}
    if db == "postgresql":
        took = {i for _, t in one_calls for i in t}
        assert {ref.id for ref in ups.values()} <= took, one_calls


@pytest.fixture
def riding(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The ids each claim that rode along with a finalize call leased (a spy on
    Claimer.asked_claims; the calls run unchanged against the database)."""
    seen: list[list[int]] = []
    real = Claimer.asked_claims

    def spy(self: Claimer, ask: LeaseAsk) -> list[Claimed]:
        got = real(self, ask)
        seen.append([c.id for c in got])
        return got

    monkeypatch.setattr(Claimer, "asked_claims", spy)
    return seen


@pytest.fixture
def steady_queue(make_queue: Callable[..., JobQueue],
                 monkeypatch: pytest.MonkeyPatch) -> JobQueue:
    """A queue whose promotion sweep and group census are never due during a test, so every
    claim that may ride along with a finalize call does."""
    monkeypatch.setattr(claim_mod, "LOOK_EVERY", 60.0)
    return make_queue(poll_interval=60.0)


@PG_ONLY
async def test_a_dag_step_is_leased_by_the_call_that_releases_it(
    steady_queue: JobQueue, riding: list[list[int]],
) -> None:
    """A chain of jobs: each finalize call releases the next job and, in the same call,
    leases it to the worker (no claim round trip between two steps of a DAG). Order holds,
    each job runs once. (A step is claimed the usual way when the promotion sweep or the
    group census is due, kept out of the way here, or when its job finished while the pump
    was in a claim: the flusher then writes the outcome alone.)"""
    q = steady_queue
    order: list[int] = []

    @q.handler("step")
    async def step(ctx: JobContext, i: int) -> None:
        order.append(i)

    async with q:
        async with q.batch() as b:
            refs = [b.add("step", {"i": 0})]
            for i in range(1, 12):
                refs.append(b.add("step", {"i": i}, depends_on=[refs[-1]]))
        await q.run_until_idle()
        for ref in refs:
            job = await q.get(ref.id)
            assert job.state == JobState.DONE and job.attempts == 1
    assert order == list(range(12))
    leased = [i for ids in riding for i in ids]
    assert len(leased) == len(set(leased))
    assert set(leased) <= {ref.id for ref in refs[1:]}
    assert len(leased) >= 5, riding  # most steps; none without the riding claim


@PG_ONLY
async def test_the_riding_claim_takes_only_its_group_and_handler_types(
    steady_queue: JobQueue, riding: list[list[int]],
) -> None:
    """The claim made by a finalize call picks from the group this worker knows to be the
    only one, and only jobs it has handlers for: a released job of another type stays
    ready for a worker that has its handler; one of another group is found by the census
    of the claim that follows the empty pick (the sweep and census windows kept open, so
    the finalize call does make the claim)."""
    q = steady_queue
    ran: list[str] = []

    @q.handler("x")
    async def x(ctx: JobContext, name: str) -> None:
        ran.append(name)

    async with q:
        async with q.batch() as b:
            up = b.add("x", {"name": "up"}, group="g")
            other_type = b.add("y", {}, group="g", depends_on=[up])
            other_group = b.add("x", {"name": "h"}, group="h", depends_on=[up])
        await q.run_until_idle()
        assert await q.wait(other_group.id, timeout=1) is None
        job = await q.get(other_type.id)
        assert job.state == JobState.READY and job.attempts == 0
    assert ran == ["up", "h"]
    assert riding and all(ids == [] for ids in riding), riding  # asked, found nothing


@PG_ONLY
async def test_a_declined_call_leases_nothing(make_queue: Callable[..., JobQueue]) -> None:
    """Where the routine declines (a sibling failed: the long path must fail the
    container), the claim riding along is undone with the rest: nothing leased."""
    q = make_queue()
    async with q:
        async with q.batch() as b:
            box = b.container("box")
            bad = b.add("t", {}, parent=box)
            last = b.add("t", {}, parent=box)
        got = await q._write(lambda conn: q._core.claimer.claim(conn, 5, ["t"]))
        assert sorted(c.id for c in got) == [bad.id, last.id]
        spare = await q.enqueue("t", {})
        await q._write(lambda conn: q._core.finalizer.finish(conn, [Outcome(
            bad.id, 1, q.worker_id, "failed", error={"type": "E"}, retryable=False)]))
        ask = LeaseAsk("default", ["t"], 5)
        took = await q._core.db.autocommit(lambda conn: q._core.finalizer.finish_in_one_call(
            conn, [Outcome(last.id, 1, q.worker_id, "done")], ask))
        assert took == set() and ask.rows is None
        for jid, state, attempts in ((last.id, JobState.RUNNING, 1), (spare, JobState.READY, 0)):
            job = await q.get(jid)
            assert job.state == state and job.attempts == attempts

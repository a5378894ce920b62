"""The counted finalize (MySQL/MariaDB, no UPDATE ... RETURNING): a round whose outcomes are
all successes of jobs leased with no parent and no dependents writes them by one fenced
UPDATE, counted. What must hold: where the count falls short (an edge added to a running
job, an attempt fenced out) nothing of that try stays (rolled back) and the general
finalize writes the batch; a capped round then hands over only what it really freed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, select
from stmtkit import count_statements

from aiojobqueue import JobQueue
from aiojobqueue.finalize import Finalizer, Outcome, Recount

MARIADB = pytest.mark.parametrize("db", ["mariadb"], indirect=True)


async def _states(q: JobQueue) -> dict[int, str]:
    J = q._t.jobs

    async def read(conn: Any) -> dict[int, str]:
        return {r.id: r.state for r in await conn.execute(select(J.c.id, J.c.state))}

    return await q._read(read)


@MARIADB
@pytest.mark.parametrize("cap", [None, 4])
async def test_independent_jobs_finish_by_one_counted_update(
    make_queue: Callable[..., JobQueue], cap: int | None,
) -> None:
    """Uncapped and under concurrency=4: draining independent jobs never locks-and-reads
    a finished row nor looks up its dependents (the general path does both, per round)."""
    q = make_queue(capacity=4, concurrency=cap)

    @q.handler("t")
    async def t(ctx: Any) -> None:
        return None

    async with q:
        async with q.batch() as b:
            for _ in range(40):
                b.add("t", {})
        with count_statements(q) as seen:
            await q.run_until_idle()
        assert set((await _states(q)).values()) == {"done"}
        deps = q._t.deps.name
        assert not [s for s in seen if deps in s], "a dependents look-up in a drain"
        locks = [s for s in seen if "FOR UPDATE" in s and "attempt_limit" in s]
        assert not locks, "the finalize's lock-and-read ran"


@MARIADB
async def test_results_are_stored_by_the_counted_update(
    make_queue: Callable[..., JobQueue],
) -> None:
    """Jobs returning a result (every other one None): one UPDATE per round stores them all
    (no UPDATE per job), each its own, and None as SQL NULL, as the general path does."""
    q = make_queue(capacity=8, concurrency=8)

    @q.handler("t")
    async def t(ctx: Any, i: int) -> Any:
        return {"i": i, "s": "x" * i} if i % 2 else None

    async with q:
        async with q.batch() as b:
            refs = [b.add("t", {"i": i}) for i in range(24)]
        with count_statements(q) as seen:
            await q.run_until_idle()
        for i, ref in enumerate(refs):
            job = await q.get(ref.id)
            assert job.state == "done"
            assert job.result == ({"i": i, "s": "x" * i} if i % 2 else None)
        J = q._t.jobs
        null = await q._read(lambda conn: _scalar(conn, select(func.count()).select_from(J)
                                                  .where(J.c.result.is_(None))))
        assert null == 12  # SQL NULL, not JSON null
        per_job = [s for s in seen if s.startswith(f"UPDATE {J.name}") and "result" in s
                   and "WHERE" in s and " IN " not in s]
        assert not per_job, "a result written by an UPDATE of its own"


@MARIADB
async def test_a_fenced_out_outcome_rolls_the_counted_try_back(
    make_queue: Callable[..., JobQueue],
) -> None:
    """Three leased; one outcome names a wrong attempt: finish_counted raises Recount and,
    its transaction rolled back, the other two are still running (then finish_detailed
    applies exactly those two)."""
    q = make_queue(concurrency=3)
    async with q:
        async with q.batch() as b:
            for _ in range(3):
                b.add("t", {})
        core = q._core
        got = await q._write(lambda conn: core.claimer.claim(conn, 3, ["t"]))
        assert len(got) == 3
        outs = [Outcome(c.id, c.attempt, q.worker_id, "done") for c in got]
        bad = [*outs[:2], Outcome(got[2].id, got[2].attempt + 1, q.worker_id, "done")]
        fin: Finalizer = core.finalizer
        with pytest.raises(Recount):
            await q._write(lambda conn: fin.finish_counted(conn, bad))
        assert set((await _states(q)).values()) == {"running"}
        applied = await q._write(lambda conn: fin.finish_detailed(conn, bad))
        assert {o.job_id for o in applied} == {got[0].id, got[1].id}
        states = await _states(q)
        assert [states[c.id] for c in got] == ["done", "done", "running"]


@MARIADB
async def test_an_edge_added_to_a_running_job_is_released_by_the_fallback(
    make_queue: Callable[..., JobQueue],
) -> None:
    """A job leased alone gets a dependent while it runs: the counted UPDATE skips it (it
    has dependents now), the round is written again by the general finalize, and the
    dependent is released and runs. The cap (concurrency=2) counts it all along."""
    q = make_queue(capacity=2, concurrency=2)
    go = asyncio.Event()
    started = asyncio.Event()
    ran: list[str] = []

    @q.handler("slow")
    async def slow(ctx: Any) -> None:
        started.set()
        await go.wait()
        ran.append("slow")

    @q.handler("after")
    async def after(ctx: Any) -> None:
        ran.append("after")

    recounts = [0]
    real = Finalizer.finish_counted

    async def counting(self: Finalizer, conn: Any, outcomes: Any) -> None:
        try:
            await real(self, conn, outcomes)
        except Recount:
            recounts[0] += 1
            raise

    async with q:
        first = await q.enqueue("slow", {})
        serving = asyncio.create_task(q.run_until_idle())
        await asyncio.wait_for(started.wait(), 10)
        second = await q.enqueue("after", {}, depends_on=[first])
        Finalizer.finish_counted = counting  # type: ignore[method-assign]
        try:
            go.set()
            await asyncio.wait_for(serving, 20)
        finally:
            Finalizer.finish_counted = real  # type: ignore[method-assign]
        states = await _states(q)
        assert states[first] == "done" and states[second] == "done"
        assert ran == ["slow", "after"]
        assert recounts[0] >= 1  # the counted try fell short and was rolled back
        J = q._t.jobs
        n = await q._read(lambda conn: _scalar(conn, select(func.count()).select_from(J)
                                               .where(J.c.state == "running")))
        assert n == 0


async def _scalar(conn: Any, stmt: Any) -> Any:
    return (await conn.execute(stmt)).scalar_one()

"""The hand-over under a counted cap: a claim in the same transaction as a finalize takes
over the slots that finalize freed, for the one known group, without the gate and without
counting. What must hold: it leases no more than the finalize took out of ``running`` (a
fenced-out outcome frees nothing), so the running count never grows and the cap holds
however the gated claims of other workers interleave; and it does not wait for the gate."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, select

from aiojobqueue import JobQueue
from aiojobqueue.claimed import Claimed, LeaseAsk
from aiojobqueue.finalize import Outcome

PG_ONLY = pytest.mark.parametrize("db", ["postgresql"], indirect=True)


async def _running(q: JobQueue) -> int:
    J = q._t.jobs
    return int(await q._read(lambda conn: _scalar(conn, select(func.count()).select_from(J)
                                                  .where(J.c.state == "running"))))


async def _scalar(conn: Any, stmt: Any) -> Any:
    return (await conn.execute(stmt)).scalar_one()


async def _leased_to_the_cap(q: JobQueue, n: int) -> list[Claimed]:
    async with q.batch() as b:
        for _ in range(n):
            b.add("t", {}, group="g")
    got = await q._write(lambda conn: q._core.claimer.claim(conn, 10, ["t"]))
    # the census found one group: the claimer knows it (the hand-over's condition)
    assert q._core.claimer.single_group == "g"
    return got


async def test_handover_leases_what_the_finalize_freed_without_the_gate(
    make_queue: Callable[..., JobQueue], db: str,
) -> None:
    """concurrency=3: 3 leased; one transaction finishes 2 and hands their slots over: 2
    more leased, 3 running. Where the gate is a row lock, it completes while another
    connection holds the gate, and a gated claim waits for it."""
    q = make_queue(concurrency=3, poll_interval=5.0)
    async with q:
        got = await _leased_to_the_cap(q, 10)
        assert len(got) == 3
        core = q._core

        async def hand_over(conn: Any) -> list[Claimed]:
            applied = await core.finalizer.finish_detailed(
                conn, [Outcome(c.id, c.attempt, q.worker_id, "done") for c in got[:2]])
            # quick: the census of the claim above is trusted for a poll_interval
            return await core.claimer.claim(conn, 10, ["t"], quick=True,
                                            freed={"g": len(applied)})

        gated: asyncio.Task[list[Claimed]] | None = None
        holder = None
        if db != "sqlite":  # (SQLite's write lock is its gate: nothing to hold beside it)
            holder = await q.engine.connect()
            await holder.begin()
            await core.db.ops.lock_gate(holder)
            gated = asyncio.create_task(q._write(lambda conn: core.claimer.claim(
                conn, 10, ["t"])))
        try:
            handed = await asyncio.wait_for(q._write(hand_over), timeout=10)
            if gated is not None:
                await asyncio.sleep(0.3)
                assert not gated.done()  # the claim that counts waits for the gate
        finally:
            if holder is not None:
                await holder.rollback()
                await holder.close()
        assert len(handed) == 2
        if gated is not None:
            assert await gated == []  # the cap is full again: nothing for it
        assert await _running(q) == 3


async def test_handover_is_limited_by_what_each_capped_group_freed(
    make_queue: Callable[..., JobQueue],
) -> None:
    """group_limits={"g": 2}: slots freed by another group are not handed to g."""
    q = make_queue(group_limits={"g": 2}, poll_interval=5.0)
    async with q:
        got = await _leased_to_the_cap(q, 6)
        assert len(got) == 2
        core = q._core

        async def hand_over(conn: Any) -> list[Claimed]:
            return await core.claimer.claim(conn, 10, ["t"], quick=True, freed={"other": 3})

        assert await q._write(hand_over) == []
        assert await _running(q) == 2


@PG_ONLY
async def test_routine_handover_leases_no_more_than_the_call_finished(
    make_queue: Callable[..., JobQueue],
) -> None:
    """The one-call routine's hand-over (LeaseAsk.hand): concurrency=3, 3 leased; one of
    them finishes and a gated claim fills its slot. A call given all 3 outcomes again
    finishes 2 (the third is fenced out) and leases 2: still 3 running (a riding claim of
    3 would make it 4)."""
    q = make_queue(concurrency=3)
    async with q:
        got = await _leased_to_the_cap(q, 10)
        assert len(got) == 3
        core = q._core
        outs = [Outcome(c.id, c.attempt, q.worker_id, "done") for c in got]
        await q._write(lambda conn: core.finalizer.finish_detailed(conn, outs[2:]))
        assert len(await q._write(lambda conn: core.claimer.claim(conn, 10, ["t"]))) == 1
        ask = LeaseAsk("g", ["t"], 3, hand=True)  # (built as Slots.hand_ask would)
        took = await core.db.autocommit(
            lambda conn: core.finalizer.finish_in_one_call(conn, outs, ask))
        assert {i for i, _ in took} == {got[0].id, got[1].id}
        assert ask.rows is not None and len(ask.rows) == 2
        assert await _running(q) == 3

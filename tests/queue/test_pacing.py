"""A busy worker's rounds wait to carry more (aiojobqueue.worker.pacing): fewer, larger
finalizes and claims where nothing waits on them, and never where something does."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, select

from aiojobqueue import JobQueue
from aiojobqueue.claimed import Claimed
from aiojobqueue.finalize import Outcome
from aiojobqueue.worker import pacing, rounds
from aiojobqueue.worker.loop import ROUNDS
from aiojobqueue.worker.outcomes import Outcomes
from aiojobqueue.worker.state import Running, WorkerState

SERVERS = pytest.mark.parametrize("db", ["postgresql", "mariadb"], indirect=True)


def _claimed(i: int, dependents: bool = False) -> Claimed:
    return Claimed(i, "t", {}, 1, "g", None, None, None, has_dependents=dependents)


async def _state(running: list[Claimed], buffered: int) -> WorkerState:
    state = WorkerState()
    for c in running:
        task = asyncio.create_task(asyncio.sleep(0))
        state.running[c.id] = Running(c, task, 0.0)
    state.buffer.extend((_claimed(1000 + i), 0.0) for i in range(buffered))
    return state


def _done(c: Claimed) -> Outcome:
    return Outcome(c.id, c.attempt, "w", "done")


def _pacer(round_time: float) -> pacing.Pacer:
    p = pacing.Pacer()
    p.ran(round_time)
    return p


async def test_a_busy_round_waits_for_half_its_usual_lease_at_most_round_hold() -> None:
    """8 slots, 37 buffered, 10 ms jobs, 5 ms rounds: the round waits while it would lease
    fewer than half of 48, for ROUND_HOLD after the oldest outcome."""
    jobs = [_claimed(i) for i in range(3)]
    state = await _state(jobs, buffered=37)
    outbox = [_done(c) for c in jobs]
    p = _pacer(0.005)
    held = p.hold(state, outbox, 100.0, 8, 48, 0.01, want=3, now=100.005)
    assert held == pytest.approx(pacing.ROUND_HOLD - 0.005)
    assert p.hold(state, outbox, 100.0, 8, 48, 0.01, want=24, now=100.005) <= 0
    assert p.hold(state, outbox, 100.0, 8, 48, 0.01, want=3, now=100.03) <= 0


async def test_a_round_never_waits_where_something_waits_on_it() -> None:
    jobs = [_claimed(1), _claimed(2, dependents=True)]
    outbox = [_done(c) for c in jobs]
    p = _pacer(0.002)
    # a finished job that has dependents (a DAG step): its release must not wait
    state = await _state(jobs, buffered=40)
    assert p.hold(state, outbox, 100.0, 8, 48, 0.01, want=2, now=100.0) <= 0
    # fewer buffered jobs than slots: a slot could run dry meanwhile
    state = await _state(jobs[:1], buffered=7)
    assert p.hold(state, outbox[:1], 100.0, 8, 48, 0.01, want=1, now=100.0) <= 0
    # before any round ran, and in a slow round: only while the buffer outlasts two rounds
    state = await _state(jobs[:1], buffered=8)  # 10 ms of work for the 8 slots
    assert pacing.Pacer().hold(state, outbox[:1], 100.0, 8, 48, 0.01, want=1, now=100.0) <= 0
    assert _pacer(0.004).hold(state, outbox[:1], 100.0, 8, 48, 0.01, want=1, now=100.0) == \
        pytest.approx(0.002)
    assert _pacer(0.006).hold(state, outbox[:1], 100.0, 8, 48, 0.01, want=1, now=100.0) <= 0


@SERVERS
async def test_mysql_rounds_carry_more_than_postgresqls(
    make_queue: Callable[..., JobQueue], db: str,
) -> None:
    """On MySQL/MariaDB a round is two transactions of three statements or more, so its
    prefetch aims at WIDE_HORIZON seconds of work (at most WIDE_FLOOR jobs) and a busy round
    may wait WIDE_HOLD x ROUND_HOLD; PostgreSQL's autocommit rounds keep the usual pace.
    8 slots of 10 ms jobs with a backlog: 96 jobs ahead and 60 ms against 40 and 20 ms."""
    q = make_queue(capacity=8)
    async with q:
        core = q._started()
        state = WorkerState()
        state.backlog = True
        core.claimer.single_group = "default"  # (many groups: PREFETCH_FLOOR_GROUPS)
        rnd = ROUNDS[core.round_kind](core, state, Outcomes(core, state, lambda _c: None))
        mysql = db == "mariadb"
        assert rnd.prefetch(0.01) == (rounds.WIDE_FLOOR if mysql else 40)
        # over many groups (a census and a pick per group), more: up to the round kind's
        # floor_groups, 384 on MySQL/MariaDB (its census reads the groups' entries) and 192
        core.claimer.single_group = None
        assert rnd.prefetch(0.001) == (rounds.WIDE_FLOOR_GROUPS if mysql
                                       else rounds.PREFETCH_FLOOR_GROUPS)
        jobs = [_claimed(i) for i in range(3)]
        state = await _state(jobs, buffered=96)
        held = _pacer(0.002).hold(state, [_done(c) for c in jobs], 100.0, 8, 104, 0.01,
                                  want=3, now=100.0, scale=rnd.hold_scale)
        assert held == pytest.approx(pacing.ROUND_HOLD * (rounds.WIDE_HOLD if mysql else 1))


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
async def test_sqlite_leases_a_few_more_ahead_over_many_groups(
    make_queue: Callable[..., JobQueue], db: str,
) -> None:
    """SQLite's one writer keeps its prefetch short (max(SHARED_AHEAD, capacity): a worker
    leasing far ahead would hoard the queue), but where the last census found several
    groups a claim pays a census and a pick per group: SHARED_AHEAD_GROUPS then, so those
    costs are spread over more jobs. 8 slots of 1 ms jobs with a backlog."""
    q = make_queue(capacity=8)
    async with q:
        core = q._started()
        state = WorkerState()
        state.backlog = True
        rnd = ROUNDS[core.round_kind](core, state, Outcomes(core, state, lambda _c: None))
        assert isinstance(rnd, rounds.SharedRound)
        core.claimer.single_group = "default"
        assert rnd.prefetch(0.001) == rounds.SHARED_AHEAD
        core.claimer.single_group = None  # several groups with runnable jobs
        assert rnd.prefetch(0.001) == rounds.SHARED_AHEAD_GROUPS
        assert rnd.prefetch(0.05) == 8  # still no more than PREFETCH_HORIZON of work


async def _mean_batch(make_queue: Callable[..., JobQueue], n: int, kind: str) -> float:
    """Jobs per finalize over a drain of ``n`` jobs of 2-18 ms of type ``kind`` by one worker of
    capacity 8:
    a finalize stamps all its rows with one statement's clock, so the number of distinct
    finished_at values is the number of finalizes."""
    q = make_queue(capacity=8)

    async def t(ctx: Any) -> None:
        await asyncio.sleep(random.uniform(0.002, 0.018))  # out of step with each other

    q.handler(kind)(t)

    async with q:
        async with q.batch() as b:
            for _ in range(n):
                b.add(kind, {})
        await q.run_until_idle()
        J = q._t.jobs

        async def read(conn: Any) -> tuple[int, int]:
            row = (await conn.execute(select(
                func.count(), func.count(func.distinct(J.c.finished_at))).where(
                (J.c.state == "done") & (J.c.type == kind)))).one()
            return int(row[0]), int(row[1])

        done, stamps = await q._read(read)
    assert done == n
    return done / stamps


@SERVERS
@pytest.mark.timeout(120)
async def test_a_busy_worker_finalizes_in_larger_batches(
    make_queue: Callable[..., JobQueue], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same drain with the rounds held and without (ROUND_HOLD = 0: every round goes
    as soon as the one before it ends): held, each finalize writes at least twice as many."""
    held = await _mean_batch(make_queue, 400, "held")
    monkeypatch.setattr(pacing, "ROUND_HOLD", 0.0)
    eager = await _mean_batch(make_queue, 400, "eager")
    print(f"jobs per finalize: held {held:.1f}, eager {eager:.1f}")
    assert held >= 2 * eager, (held, eager)

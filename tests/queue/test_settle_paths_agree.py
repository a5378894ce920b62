"""PostgreSQL's one-call finalize routine (PL/pgSQL: finalize, release, activation, roll-up)
and the general Python path (finish_detailed and settle, plain statements) are two
implementations of one thing: on the same random DAGs with the same random outcomes they
must leave every job in the same state, with the same attempts, result and error type, and
release the same jobs at every step.

Both queues run the same schedule, step by step: claim everything runnable (the jobs
released by the step before), decide each attempt's outcome from the seed (success with or
without a result, a retryable or a final failure, a cancellation), write them (queue A: the
successes by the routine, the rest and what it declined by finish_detailed; queue B: all by
finish_detailed with no routine at all), and compare what the next claim finds. Midway an
operator cancels a waiting job; once the DAG is settled, failed and cancelled jobs are
retried and the DAG runs on.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from conftest import drop_tables
from sqlalchemy import select

from aiojobqueue import DependencyCycleError, JobQueue
from aiojobqueue.claimed import Claimed
from aiojobqueue.core import Core
from aiojobqueue.finalize import Outcome
from aiojobqueue.release import ReturningWrites

PG_ONLY = pytest.mark.parametrize("db", ["postgresql"], indirect=True)
N = 30  # jobs and containers per DAG


def dag(rng: random.Random) -> list[dict[str, Any]]:
    """A random DAG in add order: containers, children, edges to earlier entries."""
    out: list[dict[str, Any]] = []
    for i in range(N):
        boxes = [j for j, e in enumerate(out) if e["box"]]
        e: dict[str, Any] = {"box": i < N - 3 and rng.random() < 0.15, "deps": [],
                             "parent": rng.choice(boxes) if boxes and rng.random() < 0.35
                             else None, "priority": rng.randrange(3)}
        earlier = [j for j in range(i) if j != e["parent"]]
        e["deps"] = sorted(rng.sample(earlier, min(len(earlier), rng.randrange(3))))
        out.append(e)
    return out


async def insert(q: JobQueue, spec: list[dict[str, Any]]) -> list[int]:
    async with q.batch() as b:
        refs: list[Any] = []
        for i, e in enumerate(spec):
            kw: dict[str, Any] = {"depends_on": [refs[d] for d in e["deps"]],
                                  "parent": None if e["parent"] is None else refs[e["parent"]],
                                  "priority": e["priority"]}
            refs.append(b.container(f"box{i}", **kw) if e["box"] else
                        b.add("t", {"i": i}, max_attempts=2, **kw))
    return [r.id for r in refs]


def outcome(seed: int, c: Claimed, index: int, me: str) -> Outcome:
    """The outcome of attempt ``c.attempt`` of job ``index``: the same on both queues."""
    r = random.Random(f"{seed}:{index}:{c.attempt}").random()
    if r < 0.4:
        return Outcome(c.id, c.attempt, me, "done")
    if r < 0.78:
        return Outcome(c.id, c.attempt, me, "done", result={"i": index, "a": c.attempt})
    if r < 0.9:
        return Outcome(c.id, c.attempt, me, "failed", error={"type": "Flaky"})
    if r < 0.95:
        return Outcome(c.id, c.attempt, me, "failed", error={"type": "Bad"}, retryable=False)
    return Outcome(c.id, c.attempt, me, "cancelled")


async def claim_all(core: Core) -> list[Claimed]:
    async def take(conn: Any) -> list[Claimed]:
        await core.claimer.promote_due(conn)  # retries are due at once (no backoff)
        return await core.claimer.claim(conn, 1000, ["t"])

    return await core.db.write(take)


async def by_routine(core: Core, outs: list[Outcome]) -> int:
    """Queue A: successes by one call of the routine, the rest (and what it declined) by
    the general path, as the worker's RoutineRound does."""
    fin = core.finalizer
    done = [o for o in outs if o.kind == "done"]
    took = await core.db.autocommit(lambda conn: fin.finish_in_one_call(conn, done))
    rest = [o for o in outs if (o.job_id, o.attempt) not in took]
    if rest:
        await core.db.write(lambda conn: fin.finish_detailed(conn, rest))
    return len(took)


async def by_python(core: Core, outs: list[Outcome]) -> None:
    """Queue B: everything by finish_detailed and settle."""
    await core.db.write(lambda conn: core.finalizer.finish_detailed(conn, outs))


async def snapshot(q: JobQueue, ids: list[int]) -> list[tuple[Any, ...]]:
    """Every job's state, attempts, result, error type and cause (as an index)."""
    J = q._t.jobs
    index = {jid: i for i, jid in enumerate(ids)}

    async def read(conn: Any) -> list[tuple[Any, ...]]:
        rows = {r.id: r for r in await conn.execute(
            select(J.c.id, J.c.state, J.c.attempts, J.c.result, J.c.error, J.c.cancelled_by,
                   J.c.pending).where(J.c.id.in_(ids)))}
        return [(i, rows[jid].state, rows[jid].attempts, rows[jid].result,
                 (rows[jid].error or {}).get("type"), index.get(rows[jid].cancelled_by),
                 rows[jid].pending) for i, jid in enumerate(ids)]

    return await q._read(read)


@PG_ONLY
@pytest.mark.parametrize("seed", range(12))
async def test_the_routine_and_the_python_path_settle_alike(
    make_queue: Callable[..., JobQueue], seed: int
) -> None:
    rng = random.Random(seed)
    qa = make_queue(retry_backoff=0.0, retry_backoff_max=0.0)
    qb = make_queue(retry_backoff=0.0, retry_backoff_max=0.0, prefix=f"b{qa.prefix}")
    try:
        await run_both(qa, qb, seed, rng)
    finally:
        await qb.close()
        await drop_tables(str(qb._url), qb.prefix)


async def run_both(qa: JobQueue, qb: JobQueue, seed: int, rng: random.Random) -> None:
    async with qa, qb:
        a, b = qa._core, qb._core
        assert a is not None and b is not None
        assert a.finalizer.settle_call is not None, "the routine must be installed"
        b.settler.path = ReturningWrites(b.db)  # no release routine either
        for _ in range(50):  # a DAG the cycle check accepts
            spec = dag(rng)
            try:
                ids_a = await insert(qa, spec)
                break
            except DependencyCycleError:
                continue
        ids_b = await insert(qb, spec)
        index_a = {jid: i for i, jid in enumerate(ids_a)}
        index_b = {jid: i for i, jid in enumerate(ids_b)}
        releases: list[list[int]] = []
        retried = False
        by_call = 0  # successes the routine finished (not declined)
        for step in range(200):
            got_a, got_b = await claim_all(a), await claim_all(b)
            seen_a = sorted(index_a[c.id] for c in got_a)
            assert seen_a == sorted(index_b[c.id] for c in got_b), (step, releases)
            assert await snapshot(qa, ids_a) == await snapshot(qb, ids_b), step
            releases.append(seen_a)
            if step == 2:  # an operator cancels a job still waiting, on both
                live = [i for i, row in enumerate(await snapshot(qa, ids_a))
                        if row[1] == "waiting"]
                if live:
                    victim = rng.choice(live)
                    await qa.cancel(ids_a[victim])
                    await qb.cancel(ids_b[victim])
            if not got_a:
                if retried:
                    break
                # settled: retry what ended badly (with what its end cancelled), go on
                retried = True
                bad = [i for i, row in enumerate(await snapshot(qa, ids_a))
                       if row[1] in ("failed", "cancelled") and not spec[i]["box"]]
                for i in rng.sample(bad, min(len(bad), 3)):
                    for q, ids in ((qa, ids_a), (qb, ids_b)):
                        try:
                            await q.retry(ids[i])
                        except Exception as exc:  # revived with an earlier retry: both alike
                            assert type(exc).__name__ == "InvalidStateError", exc
                continue
            by_call += await by_routine(
                a, [outcome(seed, c, index_a[c.id], qa.worker_id) for c in got_a])
            await by_python(b, [outcome(seed, c, index_b[c.id], qb.worker_id) for c in got_b])
        final = await snapshot(qa, ids_a)
        assert final == await snapshot(qb, ids_b)
        assert all(row[1] in ("done", "failed", "cancelled") for row in final), final
        assert len(releases) > 2, releases
        assert by_call > 0, "the routine finished nothing: the comparison proves nothing"

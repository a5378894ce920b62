"""Fair share at scale (issue 18), on every database: the claim's split over hundreds of
groups is exactly the reference split (policy.fair_share over every group with work,
counting what each runs anywhere, with group caps and types this worker does not serve),
no group with work waits more than the stated bound, and the census reads only groups with
ready jobs, never those that once had jobs."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import event, func, select, update

from aiojobqueue import JobQueue
from aiojobqueue import schema as S
from aiojobqueue.census import Census
from aiojobqueue.claimed import Claimed
from aiojobqueue.finalize import Outcome
from aiojobqueue.policy import GroupDemand, fair_share, rotation_key
from aiojobqueue.worker.loop import ROUNDS
from aiojobqueue.worker.rounds import PREFETCH_MAX


async def claim_now(q: JobQueue, want: int, types: tuple[str, ...] = ("t",)) -> list[Claimed]:
    return await q._write(lambda conn: q._core.claimer.claim(conn, want, list(types)))


async def finish(q: JobQueue, got: list[Claimed]) -> None:
    outs = [Outcome(c.id, c.attempt, q.worker_id, "done") for c in got]
    await q._write(lambda conn: q._core.finalizer.finish(conn, outs))


async def enqueue(q: JobQueue, jobs: list[tuple[str, str, int]]) -> None:
    """(type, group, weight) per job, in one batch."""
    b = q.batch()
    for typ, g, w in jobs:
        b.add(typ, {}, group=g, weight=w)
    await b.commit()


async def world(q: JobQueue) -> tuple[dict[str, GroupDemand], Counter[str]]:
    """What the reference split sees, read plainly: per group with ready jobs of type "t",
    its weight (the largest among its ready jobs, any type) and what it runs anywhere; and
    how many such jobs it has."""
    J = q._t.jobs

    async def read(conn: Any) -> tuple[Any, Any]:
        ready = (await conn.execute(select(J.c.group_key, J.c.type, J.c.weight).where(
            J.c.state == S.READY))).all()
        running = (await conn.execute(select(J.c.group_key, func.count()).where(
            J.c.state == S.RUNNING).group_by(J.c.group_key))).all()
        return ready, running

    ready, running = await q._read(read)
    runs = {g: int(n) for g, n in running}
    avail: Counter[str] = Counter(g for g, t, _ in ready if t == "t")
    weight: dict[str, int] = {}
    for g, _, w in ready:
        weight[g] = max(weight.get(g, 1), int(w))
    caps = q._core.settings.group_limits
    demand = {}
    for g in avail:
        cap = caps.get(g)
        r = runs.get(g, 0)
        demand[g] = GroupDemand(weight[g], r, None if cap is None else max(cap - r, 0))
    return demand, avail


def reference(free: int, demand: dict[str, GroupDemand], avail: Counter[str],
              after: str | None) -> Counter[str]:
    """The claim's split by the pure function over every group with work: slots
    fair_share gives a group beyond the jobs it has go on to the others."""
    grants: Counter[str] = Counter()
    demand = dict(demand)
    while free > 0 and demand:
        plan = fair_share(free, demand, rotate=True, after=after)
        short = []
        for g, n in plan.items():
            got = min(n, avail[g] - grants[g])
            grants[g] += got
            free -= got
            if got < n:
                short.append(g)
            else:
                d = demand[g]
                demand[g] = GroupDemand(d.weight, d.running + got,
                                        None if d.cap is None else d.cap - got)
        if not short:
            break
        for g in short:
            demand.pop(g)
    return +grants


@pytest.mark.parametrize("capped", [True, False])
async def test_claims_split_exactly_as_the_reference_over_hundreds_of_groups(
    make_queue: Callable[..., JobQueue], capped: bool, db: str,
) -> None:
    """(Without group caps, PostgreSQL's claims over many groups mostly skip the census:
    claim.idle_pick_stmt.)"""
    rng = random.Random(18)
    groups = [f"g{i:03d}" for i in range(300)]
    caps = {g: rng.randint(0, 2) for g in rng.sample(groups, 30)} if capped else {}
    q = make_queue(group_limits=caps)
    other = make_queue()  # another worker: what it runs counts for every group
    jobs = []
    for g in groups:
        heavy = rng.random() < 0.2
        for _ in range(rng.randint(1, 4)):
            jobs.append(("t", g, rng.choice((2, 3)) if heavy else 1))
        if rng.random() < 0.1:
            jobs.append(("u", g, 1))  # a type this worker does not serve
    jobs += [("u", f"only-u{i}", 1) for i in range(20)]
    rng.shuffle(jobs)
    statements: list[str] = []

    def spy(_c: Any, _cur: Any, stmt: str, *_: Any) -> None:
        statements.append(stmt)

    async with q, other:
        event.listen(q.engine.sync_engine, "before_cursor_execute", spy)
        await enqueue(q, jobs)
        await claim_now(other, 25)
        held: list[Claimed] = []
        leased = 0
        for step in range(40):
            demand, avail = await world(q)
            if not demand:
                break
            want = rng.choice((1, 3, 10, 40))
            expect = reference(want, demand, avail, q._core.claimer.cursor)
            got = await claim_now(q, want)
            assert Counter(c.group for c in got) == expect, step
            # what the split gives every group is within one slot of its weight's share
            total = {g: d.running + expect[g] for g, d in demand.items()}
            for g in expect:
                for h, dh in demand.items():
                    if h != g and (dh.cap is None or expect[h] < dh.cap) \
                            and expect[h] < avail[h]:
                        assert (total[g] - 1) * dh.weight <= total[h] * demand[g].weight
            held += got
            leased += len(got)
            rng.shuffle(held)
            done, held = held[: len(held) // 2], held[len(held) // 2 :]
            await finish(q, done)
        assert leased > 300
        if db == "postgresql" and not capped:  # the path without a census was taken
            assert any("idle_scan" in x for x in statements)
        event.remove(q.engine.sync_engine, "before_cursor_execute", spy)


async def test_no_group_with_work_waits_more_than_the_others_count(
    make_queue: Callable[..., JobQueue],
) -> None:
    """The bound: a group with work and nothing running gets a slot before any other group
    gets its next one, so between two slots of a group at most (groups with work - 1)
    slots go to others: here each claim's jobs finish before the next claim, so the
    grants go round the groups in turn whatever the claim sizes."""
    q = make_queue()
    groups = [f"g{i:03d}" for i in range(150)]
    rng = random.Random(7)
    async with q:
        await enqueue(q, [("t", g, rng.choice((1, 1, 2))) for g in groups for _ in range(3)])
        order: list[str] = []
        while True:
            after = q._core.claimer.cursor
            got = await claim_now(q, rng.choice((1, 4, 7, 16)))
            if not got:
                break
            # a claim's grants in the order fair_share makes them (its rotation)
            order += sorted((c.group for c in got), key=rotation_key(after))
            await finish(q, got)
        assert Counter(order) == dict.fromkeys(groups, 3)
        last: dict[str, int] = {}
        for i, g in enumerate(order):
            assert i - last.get(g, -1) <= len(groups), (g, i, last.get(g))
            last[g] = i
        first = {g: order.index(g) for g in groups}
        assert max(first.values()) < len(groups)  # every group ran once before any twice


async def test_served_in_turn_while_jobs_run(make_queue: Callable[..., JobQueue],
                                             db: str) -> None:
    """The same bound through the worker loop (run_until_idle, capacity 5, prefetch):
    every group's first job starts before any group's second, but for one claim's worth
    (a claim's jobs start in id order, not in the order they were granted)."""
    q = make_queue(capacity=5)
    groups = [f"g{i:03d}" for i in range(200)]
    starts: list[str] = []
    async with q:
        @q.handler("t")
        async def t(ctx: Any) -> None:
            starts.append(ctx.group)

        await enqueue(q, [("t", g, 1) for g in groups for _ in range(2)])
        await q.run_until_idle()
        floor = ROUNDS[q._started().round_kind].floor_groups  # (the round kind's many-group floor)
    assert Counter(starts) == dict.fromkeys(groups, 2)
    one_claim = 5 + max(PREFETCH_MAX * 5, floor)
    assert set(starts[: len(groups) + one_claim]) == set(groups)


async def test_census_reads_only_groups_with_ready_jobs(
    make_queue: Callable[..., JobQueue],
) -> None:
    """3,000 groups that once had jobs (all finished) and 6 with ready jobs: the census
    reads those 6 (and those that run something), in at most two statements."""
    q = make_queue()
    async with q:
        await enqueue(q, [("t", f"old{i:04d}", 1) for i in range(3000)])
        J = q._t.jobs

        async def finish_all(conn: Any) -> None:
            await conn.execute(update(J).values(state=S.DONE, live_key=None,
                                                finished_at=J.c.created_at))

        await q._write(finish_all)
        await enqueue(q, [("t", f"new{i}", 1) for i in range(6) for _ in range(3)])
        await claim_now(q, 2)  # two groups now run one job each
        statements: list[str] = []

        def spy(_c: Any, _cur: Any, stmt: str, *_: Any) -> None:
            statements.append(stmt)

        async def census(conn: Any) -> Census:
            c = Census(q._core.claimer, ["t"])
            event.listen(q.engine.sync_engine, "before_cursor_execute", spy)
            try:
                await c.fill(conn, 10)
            finally:
                event.remove(q.engine.sync_engine, "before_cursor_execute", spy)
            return c

        c = await q._write(census)
        assert c.done and set(c.demand) == {f"new{i}" for i in range(6)}
        # after the cursor to the end, then from the start: each of the 6 read at most twice
        assert c.scanned <= 12
        assert sum(d.running for d in c.demand.values()) == 2
        assert len(statements) <= 2
        assert not any(q._t.groups.name in s for s in statements)


@pytest.mark.parametrize("db", ["mariadb"], indirect=True)
async def test_census_reads_one_weight_entry_per_group_on_mariadb(
    make_queue: Callable[..., JobQueue],
) -> None:
    """MariaDB's ix_ready_weight has an entry for every row (no partial index), so the
    census's "largest weight" probe is the group's first entry from the top; bounded to
    weights above 1 (the partial index's predicate elsewhere) it read a group of weight-1
    jobs to its end. 5 groups of 300 ready jobs: the census reads backwards (the probe's
    ORDER BY weight DESC) a few entries a group, not 1,500, and still finds the weight."""
    q = make_queue()
    async with q:
        await enqueue(q, [("t", f"g{i}", 1) for i in range(5) for _ in range(300)])
        await enqueue(q, [("t", "g4", 3)])

        async def prev_reads(conn: Any) -> int:
            row = (await conn.exec_driver_sql(
                "SHOW SESSION STATUS LIKE 'Handler_read_prev'")).one()
            return int(row[1])

        async def census(conn: Any) -> tuple[Census, int]:
            before = await prev_reads(conn)
            c = Census(q._core.claimer, ["t"])
            await c.fill(conn, 10)
            return c, await prev_reads(conn) - before

        c, reads = await q._write(census)
        assert c.done and {g: d.weight for g, d in c.demand.items()} == {
            "g0": 1, "g1": 1, "g2": 1, "g3": 1, "g4": 3}
        assert reads <= 5 * 3


@pytest.mark.parametrize("db", ["mariadb"], indirect=True)
async def test_one_job_each_from_many_groups_is_one_planned_pick_on_mariadb(
    make_queue: Callable[..., JobQueue],
) -> None:
    """Where every group's share is one job (a claim over many groups), MariaDB's pick is
    one sub-select joined to the groups (lease._first_each_stmt), not a UNION ALL part per
    group that the server plans anew at every call; the sub-select locks SKIP LOCKED, so a
    group whose best job another transaction holds gives its next one, as a part would."""
    q = make_queue()
    async with q:
        await enqueue(q, [("t", f"g{i:02d}", 1) for i in range(40) for _ in range(2)])
        J = q._t.jobs
        statements: list[str] = []

        def spy(_c: Any, _cur: Any, stmt: str, *_: Any) -> None:
            statements.append(stmt)

        async with q.engine.connect() as other:
            await other.begin()
            held = (await other.execute(
                select(J.c.id).where(J.c.group_key == "g00").order_by(J.c.id).limit(1)
                .with_for_update())).scalar_one()
            event.listen(q.engine.sync_engine, "before_cursor_execute", spy)
            try:
                got = await claim_now(q, 40)
            finally:
                event.remove(q.engine.sync_engine, "before_cursor_execute", spy)
            await other.rollback()
        assert sorted(c.group for c in got) == [f"g{i:02d}" for i in range(40)]
        g00 = next(c for c in got if c.group == "g00")
        assert g00.id != held  # its second job: the held one was passed over
        picks = [s for s in statements if "SKIP LOCKED" in s]
        assert len(picks) == 1
        assert picks[0].count("FOR UPDATE SKIP LOCKED") == 2  # the sub-select and the join


async def test_a_claim_over_more_groups_than_one_statement_takes(
    make_queue: Callable[..., JobQueue],
) -> None:
    """650 slots over 700 groups: the picks go in several statements (SQLite takes at
    most 500 parts in a UNION ALL), each group once."""
    q = make_queue()
    async with q:
        await enqueue(q, [("t", f"g{i:03d}", 1) for i in range(700)])
        got = await claim_now(q, 650)
        assert len(got) == 650
        assert len({c.group for c in got}) == 650

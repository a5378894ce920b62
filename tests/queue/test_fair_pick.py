"""The fair pick (PostgreSQL: lease.fair_pick_stmt, census + split + picks in one
statement) against the pure reference, on a real database: where it read every group
with ready jobs, what it leases per group is policy.fair_share(rotate=True) over them
(weights, what each group runs anywhere, the rotation after the cursor); where it did not,
it serves one job to each of the first groups in rotation order that run nothing, as the
reference's first grants do. Through the claim, a few dozen groups are split exactly with
it as with the census (test_fairshare_scale.py covers hundreds of groups)."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import event
from test_fairshare_scale import claim_now, enqueue, finish, reference, world

from aiojobqueue import JobQueue
from aiojobqueue.lease import ReturningLease
from aiojobqueue.policy import fair_share, rotation_key


@pytest.mark.parametrize("db", ["postgresql"], indirect=True)  # (DialectOps.fair_pick_sql)
@pytest.mark.parametrize("seed", range(4))
async def test_the_fair_pick_splits_as_fair_share(
    make_queue: Callable[..., JobQueue], db: str, seed: int,
) -> None:
    rng = random.Random(seed)
    q, other = make_queue(), make_queue()
    n = rng.choice((3, 17, 40))
    groups = [f"g{i:03d}" for i in range(n)]
    # every group has more ready jobs than any claim asks for: nothing comes back short
    per = max(70, 12 * 60 // n + 10)
    jobs = [("t", g, w) for g in groups for w in [rng.choice((1, 1, 2, 3))] for _ in range(per)]
    rng.shuffle(jobs)
    async with q, other:
        await enqueue(q, jobs)
        await claim_now(other, rng.choice((0, 5, 30)) or 1)  # what runs elsewhere counts
        path = q._core.claimer.path
        assert isinstance(path, ReturningLease)
        checked = partial = 0
        for step in range(12):
            demand, _avail = await world(q)
            free = rng.choice((1, 2, 7, 25, 60))
            after = rng.choice([None, *groups, "a", "zz"])
            complete = rng.random() < 0.6
            lim = n + 2 if complete else rng.randint(1, n)
            taken: list[Any] = []

            async def pick(conn: Any, free: int = free, after: str | None = after,
                           lim: int = lim, taken: list[Any] = taken) -> Any:
                return await path.pick_fair(conn, free, ["t"], after, lim, taken)

            got = await q._write(pick)
            assert got is not None
            leased = Counter(r[4] for r in taken)
            expect = Counter(fair_share(free, demand, rotate=True, after=after))
            order = sorted(demand, key=rotation_key(after))
            if got.complete:
                assert got.seen == len(demand)
                assert leased == +expect, (step, free, after)
                assert sorted(got.idle) == sorted(g for g in leased
                                                  if demand[g].running == 0)
                checked += 1
            else:
                # one job each to a prefix (rotation order) of the groups running nothing
                idle = [g for g in order if demand[g].running == 0]
                assert set(leased.values()) <= {1}
                assert sorted(leased, key=rotation_key(after)) == idle[: len(leased)]
                assert len(leased) <= free
                assert all(expect[g] >= 1 for g in leased)
                partial += 1
        assert (checked and partial) or n == 3


async def test_claims_over_a_few_dozen_groups_take_one_statement_and_split_exactly(
    make_queue: Callable[..., JobQueue], db: str,
) -> None:
    """The claim's path with the fair pick (once a census has read every group) and with
    types the worker does not serve (a short pick: the census splits the rest)."""
    rng = random.Random(5)
    groups = [f"g{i:02d}" for i in range(30)]
    q, other = make_queue(), make_queue()
    jobs = []
    for g in groups:
        w = rng.choice((1, 1, 2, 3))
        jobs += [("t", g, w)] * rng.randint(2, 25)
        if rng.random() < 0.15:
            jobs.append(("u", g, 1))
    rng.shuffle(jobs)
    statements: list[str] = []

    def spy(_c: Any, _cur: Any, stmt: str, *_: Any) -> None:
        statements.append(stmt)

    async with q, other:
        event.listen(q.engine.sync_engine, "before_cursor_execute", spy)
        await enqueue(q, jobs)
        await claim_now(other, 12)
        held: list[Any] = []
        for step in range(40):
            demand, avail = await world(q)
            if not demand:
                break
            want = rng.choice((1, 3, 10, 40))
            expect = reference(want, demand, avail, q._core.claimer.cursor)
            got = await claim_now(q, want)
            assert Counter(c.group for c in got) == expect, step
            held += got
            rng.shuffle(held)
            done, held = held[: len(held) // 2], held[len(held) // 2:]
            await finish(q, done)
        event.remove(q.engine.sync_engine, "before_cursor_execute", spy)
    if db == "postgresql":
        assert sum("sa(g, n)" in s for s in statements) > 10

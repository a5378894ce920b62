"""Enqueue: single jobs, whole DAGs in one transaction, the caller's transaction, keys,
run_after, mixed dependencies, and bad input that must change nothing."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession
from stmtkit import count_statements, counts

from aiojobqueue import (
    ContainerClosedError,
    DependencyCycleError,
    InvalidJobError,
    JobContext,
    JobFailed,
    JobNotFoundError,
    JobQueue,
    JobState,
    NotJSONError,
)


def noop_handlers(q: JobQueue, *types: str) -> None:
    for t in types:
        async def run(ctx: JobContext, **_: Any) -> None:
            return None

        q.handler(t)(run)


# -- the happy paths ------------------------------------------------------------------------


async def test_enqueue_returns_id_and_get_shows_the_job(queue: JobQueue) -> None:
    jid = await queue.enqueue("t", {"x": 1, "s": "é😀"}, group="g1", weight=3, priority=7,
                              timeout=5.0, max_attempts=4, key="k1")
    job = await queue.get(jid)
    assert (job.id, job.type, job.args, job.group, job.weight, job.priority) == (
        jid, "t", {"x": 1, "s": "é😀"}, "g1", 3, 7)
    assert job.state == JobState.READY and not job.terminal
    assert (job.attempts, job.max_attempts, job.key, job.parent_id) == (0, 4, "k1", None)
    assert job.created_at.tzinfo is not None and job.result is None and job.error is None


async def test_batch_inserts_a_dag_in_one_transaction(queue: JobQueue) -> None:
    before = await counts(queue)
    async with queue.batch() as b:
        site = b.container("build-site", group="tenant-a")
        a = b.add("fetch", {"url": "u"}, parent=site)
        p = b.add("parse", {"n": 1}, parent=site, depends_on=[a])
        r = b.add("report", {}, depends_on=[site])
    assert await counts(queue) == (before[0] + 4, before[1] + 2)
    assert len({site.id, a.id, p.id, r.id}) == 4
    jobs = {x: await queue.get(x.id) for x in (site, a, p, r)}
    assert jobs[site].is_container and jobs[site].state == JobState.ACTIVE
    assert jobs[a].state == JobState.READY and jobs[a].parent_id == site.id
    assert jobs[p].state == JobState.WAITING and jobs[p].depends_on == (a.id,)
    assert jobs[r].state == JobState.WAITING and jobs[r].depends_on == (site.id,)
    assert jobs[site].group == "tenant-a" and jobs[a].group == "tenant-a"  # inherited


async def test_batch_with_an_error_in_the_block_inserts_nothing(queue: JobQueue) -> None:
    before = await counts(queue)
    with pytest.raises(RuntimeError):
        async with queue.batch() as b:
            b.add("t")
            raise RuntimeError("changed my mind")
    assert await counts(queue) == before


async def test_ten_thousand_job_batch_uses_few_statements(
    make_queue: Callable[..., JobQueue], db: str
) -> None:
    """A 10,000-job DAG (fan-out, fan-in, containers) is a handful of multi-row statements;
    it then drains with no-op handlers. Times are printed for the record (pytest -s)."""
    q = make_queue(capacity=200, poll_interval=0.02)
    noop_handlers(q, "leaf", "sink")
    async with q:
        before = await counts(q)
        with count_statements(q) as stmts:
            t0 = time.perf_counter()
            async with q.batch() as b:
                boxes = [b.container("box") for _ in range(10)]
                leaves = [b.add("leaf", {"i": i}, parent=boxes[i % 10]) for i in range(9_980)]
                sinks = [b.add("sink", {"k": k}, depends_on=[boxes[k], leaves[k]])
                         for k in range(10)]
            enqueue_s = time.perf_counter() - t0
        assert len(leaves) + len(boxes) + len(sinks) == 10_000
        assert await counts(q) == (before[0] + 10_000, before[1] + 20)
        # ~10k rows / 1000 per statement, plus locks, reads and roll-up: never one per job.
        assert len(stmts) <= 60, f"{len(stmts)} statements for one batch"
        ids = [x.id for x in leaves]
        assert len(set(ids)) == len(ids)
        sample = await q.get(leaves[4321].id)
        assert sample.args == {"i": 4321} and sample.parent_id == boxes[4321 % 10].id
        t0 = time.perf_counter()
        await q.run_until_idle()
        drain_s = time.perf_counter() - t0
        for s in sinks:
            assert (await q.get(s.id)).state == JobState.DONE
        print(f"\n[{db}] 10k batch: enqueue {enqueue_s:.2f}s in {len(stmts)} statements, "
              f"drain {drain_s:.2f}s ({10_000 / drain_s:.0f} jobs/s)")


async def test_wide_fan_in_inserts_every_edge_once(queue: JobQueue) -> None:
    """More edges than one executemany chunk (dialects.bulk.EDGE_CHUNK), some listed
    twice: every edge is stored once and the sink waits for all of them."""
    from aiojobqueue.dialects.bulk import EDGE_CHUNK

    ran: list[str] = []

    @queue.handler("leaf")
    async def leaf(ctx: JobContext) -> None:
        ran.append("leaf")

    @queue.handler("sink")
    async def sink(ctx: JobContext) -> None:
        ran.append("sink")

    before = await counts(queue)
    width = EDGE_CHUNK + 7
    async with queue.batch() as b:
        leaves = [b.add("leaf") for _ in range(width)]
        end = b.add("sink", depends_on=[*leaves, leaves[0], leaves[-1]])
    assert await counts(queue) == (before[0] + width + 1, before[1] + width)
    job = await queue.get(end.id)
    assert job.state == JobState.WAITING
    assert job.depends_on == tuple(sorted(x.id for x in leaves))
    await queue.run_until_idle()
    assert ran == ["leaf"] * width + ["sink"]


async def test_concurrent_batches_get_the_right_ids(queue: JobQueue) -> None:
    """Ids handed back map to the rows that were inserted, even with batches racing
    (MySQL-family derives ids from LAST_INSERT_ID of multi-row inserts)."""

    async def one(tag: int) -> list[tuple[int, int]]:
        async with queue.batch() as b:
            refs = [b.add("t", {"tag": tag, "i": i}) for i in range(1500)]
        return [(r.id, i) for i, r in enumerate(refs)]

    results = await asyncio.gather(*(one(t) for t in range(3)))
    J = queue._t.jobs

    async def read(conn: Any) -> dict[int, Any]:
        return {r.id: r.args for r in await conn.execute(select(J.c.id, J.c.args))}

    stored = await queue._read(read)
    for tag, pairs in enumerate(results):
        for jid, i in pairs:
            assert stored[jid] == {"tag": tag, "i": i}


@pytest.mark.parametrize("kind", ["connection", "session"])
@pytest.mark.parametrize("commit", [True, False])
async def test_batch_joins_the_callers_transaction(
    queue: JobQueue, kind: str, commit: bool
) -> None:
    before = await counts(queue)
    existing = await queue.enqueue("t", {"n": 0})
    before = (before[0] + 1, before[1])

    async def enqueue_in(conn: Any) -> Any:
        async with queue.batch(connection=conn) as b:
            box = b.container("box")
            b.add("t", {"n": 1}, parent=box, depends_on=[existing])
            return b.add("t", {"n": 2}, depends_on=[box])

    if kind == "connection":
        async with queue.engine.connect() as conn:
            await conn.begin()
            ref = await enqueue_in(conn)
            await (conn.commit() if commit else conn.rollback())
    else:
        async with AsyncSession(queue.engine) as session:
            ref = await enqueue_in(session)
            await (session.commit() if commit else session.rollback())
    if commit:
        assert await counts(queue) == (before[0] + 3, before[1] + 2)
        assert (await queue.get(ref.id)).args == {"n": 2}
    else:
        assert await counts(queue) == before
        with pytest.raises(JobNotFoundError):
            await queue.get(ref.id)


async def test_caller_transaction_jobs_are_invisible_until_commit(queue: JobQueue) -> None:
    before = await counts(queue)
    async with queue.engine.connect() as conn:
        await conn.begin()
        async with queue.batch(connection=conn) as b:
            ref = b.add("t")
        # another connection does not see the uncommitted job
        assert await counts(queue) == before
        await conn.commit()
    assert (await queue.get(ref.id)).state == JobState.READY


async def test_key_is_unique_among_live_jobs(queue: JobQueue) -> None:
    @queue.handler("t")
    async def t(ctx: JobContext, n: int) -> int:
        return n

    first = await queue.enqueue("t", {"n": 1}, key="k")
    before = await counts(queue)
    assert await queue.enqueue("t", {"n": 2}, key="k") == first
    async with queue.batch() as b:
        again = b.add("t", {"n": 3}, key="k")
        dep = b.add("t", {"n": 4}, depends_on=[again])  # may depend on the stand-in
    assert again.id == first
    assert await counts(queue) == (before[0] + 1, before[1] + 1)
    assert (await queue.get(dep.id)).depends_on == (first,)
    with pytest.raises(InvalidJobError, match="twice"):
        async with queue.batch() as b:
            b.add("t", {"n": 5}, key="dup")
            b.add("t", {"n": 6}, key="dup")
    assert await counts(queue) == (before[0] + 1, before[1] + 1)
    await queue.run_until_idle()
    assert await queue.wait(first, timeout=5) == 1
    # terminal: the key is free again
    reused = await queue.enqueue("t", {"n": 7}, key="k")
    assert reused != first and (await queue.get(reused)).state == JobState.READY
    # and a cancelled job's key too
    await queue.cancel(reused)
    assert await queue.enqueue("t", {"n": 8}, key="k") not in (first, reused)


async def test_concurrent_enqueues_of_one_key_insert_one_job(
    make_queue: Callable[..., JobQueue],
) -> None:
    """Producers racing with the same key (separate engines: real concurrency) all get the
    one job's id; the unique index on live_key turns the loser's insert into a re-read."""
    queues = [make_queue() for _ in range(4)]
    for q in queues:
        await q.start()
    before = await counts(queues[0])
    for round_ in range(3):
        ids = await asyncio.gather(
            *(q.enqueue("t", {"r": round_}, key=f"race-{round_}") for q in queues for _ in range(2))
        )
        assert len(set(ids)) == 1, ids
    assert await counts(queues[0]) == (before[0] + 3, before[1])


async def test_keyless_jobs_coexist_and_concurrent_batches_share_a_key(
    make_queue: Callable[..., JobQueue],
) -> None:
    """Any number of keyless jobs (live_key NULL) coexist, while a key stays unique among
    live jobs even between two batches in flight at once: the second, started while the
    first holds its uncommitted keyed job, waits for it (the unique index on live_key, or
    SQLite's write lock) and then stands in the committed job for its own."""
    q1, q2 = make_queue(), make_queue()
    async with q1, q2:
        J = q1._t.jobs

        async def second() -> tuple[int, list[int]]:
            async with q2.batch() as b:
                same = b.add("t", {"b": 2}, key="same")
                plain = [b.add("t", {}) for _ in range(200)]
            return same.id, [r.id for r in plain]

        async with q1.engine.connect() as conn:
            await conn.begin()
            async with q1.batch(connection=conn) as b:
                first = b.add("t", {"b": 1}, key="same")
                plain1 = [b.add("t", {}) for _ in range(200)]
            other = asyncio.create_task(second())
            await asyncio.sleep(0.3)  # time to reach the lock (the outcome is the same if not)
            assert not other.done()  # done: it inserted a second live "same" (or failed)
            await conn.commit()
        same2, plain2 = await other
        assert same2 == first.id
        assert len({r.id for r in plain1} | set(plain2)) == 400
        async with q1.engine.connect() as conn:
            n = (await conn.execute(select(func.count()).where(J.c.key == "same"))).scalar_one()
            keyless = (await conn.execute(
                select(func.count()).where(J.c.live_key.is_(None)))).scalar_one()
            assert (n, keyless) == (1, 400)
        async with q1.engine.connect() as conn:
            with pytest.raises(IntegrityError):  # the database refuses a second live "same"
                await conn.execute(update(J).where(J.c.id == plain2[0]).values(live_key="same"))


async def test_run_after_is_not_claimed_before_its_time(
    make_queue: Callable[..., JobQueue],
) -> None:
    # promotions every 0.1 s: "at" and "later" come due 0.5 s apart, so each is promoted
    # alone (unless a loaded machine stalls the worker for 0.5 s: then both are due at once and
    # the older id, "later", rightly starts first; the bounds below are what run_after promises)
    q = make_queue(poll_interval=0.1)
    seen: dict[str, float] = {}

    @q.handler("t")
    async def t(ctx: JobContext, name: str) -> None:
        seen[name] = time.monotonic()

    async with q:
        t0 = time.monotonic()
        later = await q.enqueue("t", {"name": "later"}, run_after=timedelta(seconds=1.5))
        when = datetime.now(UTC) + timedelta(seconds=1)
        at = await q.enqueue("t", {"name": "at"}, run_after=when)
        now = await q.enqueue("t", {"name": "now"})
        assert (await q.get(later)).state == JobState.SCHEDULED
        assert (await q.get(at)).state == JobState.SCHEDULED
        server = asyncio.create_task(q.serve())
        try:
            await q.wait(now, timeout=10)
            await q.wait(at, timeout=10)
            await q.wait(later, timeout=10)
        finally:
            server.cancel()
            await asyncio.gather(server, return_exceptions=True)
        assert seen["now"] < min(seen["at"], seen["later"])
        assert seen["at"] - t0 >= 0.9
        assert seen["later"] - t0 >= 1.4
        job = await q.get(later)
        assert job.started_at is not None and job.run_after is not None
        assert job.started_at >= job.run_after
        assert job.run_after - job.created_at >= timedelta(seconds=1.5)


async def test_depends_on_mixes_batch_refs_and_existing_ids(queue: JobQueue) -> None:
    order: list[str] = []

    @queue.handler("t")
    async def t(ctx: JobContext, name: str) -> None:
        order.append(name)

    old = await queue.enqueue("t", {"name": "old"}, priority=-5)
    async with queue.batch() as b:
        new = b.add("t", {"name": "new"}, priority=-5)
        both = b.add("t", {"name": "both"}, depends_on=[new, old, old], priority=10)
    job = await queue.get(both.id)
    assert job.state == JobState.WAITING
    assert job.depends_on == tuple(sorted([old, new.id]))
    await queue.run_until_idle()
    assert order.index("both") == 2


# -- bad input: a typed error and nothing inserted --------------------------------------------


class Custom:
    pass


@pytest.mark.parametrize("args", [{"s": {1, 2}}, {"x": math.nan}, {"x": math.inf}, {"o": Custom()},
                                  {1: Custom()}])
async def test_non_json_args_are_rejected(queue: JobQueue, args: Any) -> None:
    before = await counts(queue)
    with pytest.raises(NotJSONError) as ei:
        await queue.enqueue("t", args)
    assert isinstance(ei.value, TypeError) and isinstance(ei.value, ValueError)
    with pytest.raises(NotJSONError):
        async with queue.batch() as b:
            b.add("t", {"fine": True})
            b.add("t", args)
    assert await counts(queue) == before


@pytest.mark.parametrize("args", [[1, 2], "x", 3, ("a",)])
async def test_non_dict_args_are_rejected(queue: JobQueue, args: Any) -> None:
    before = await counts(queue)
    with pytest.raises(InvalidJobError, match="dict"):
        await queue.enqueue("t", args)
    assert await counts(queue) == before


async def test_unknown_ids_are_rejected(queue: JobQueue) -> None:
    real = await queue.enqueue("t")
    before = await counts(queue)
    with pytest.raises(InvalidJobError) as ei:
        await queue.enqueue("t", depends_on=[real, 987654])
    assert isinstance(ei.value, JobNotFoundError) and "987654" in str(ei.value)
    with pytest.raises(JobNotFoundError):
        async with queue.batch() as b:
            a = b.add("t")
            b.add("t", depends_on=[a], parent=987655)
    with pytest.raises(InvalidJobError):
        await queue.enqueue("t", depends_on=["nope"])  # type: ignore[list-item]
    assert await counts(queue) == before


async def test_parent_must_be_a_container(queue: JobQueue) -> None:
    plain = await queue.enqueue("t")
    before = await counts(queue)
    with pytest.raises(InvalidJobError, match="not a container"):
        await queue.enqueue("t", parent=plain)
    with pytest.raises(InvalidJobError, match="not a container"):
        async with queue.batch() as b:
            leaf = b.add("t")
            b.add("t", parent=leaf)
    assert await counts(queue) == before


async def test_children_for_a_finished_container_are_refused(queue: JobQueue) -> None:
    @queue.handler("t")
    async def t(ctx: JobContext) -> None:
        return None

    async with queue.batch() as b:
        box = b.container("box")
        b.add("t", parent=box)
        empty = b.container("empty")  # done at once
    assert (await queue.get(empty.id)).state == JobState.DONE
    await queue.run_until_idle()
    assert (await queue.get(box.id)).state == JobState.DONE
    before = await counts(queue)
    for closed in (box.id, empty.id):
        with pytest.raises(ContainerClosedError) as ei:
            await queue.enqueue("t", parent=closed)
        assert isinstance(ei.value, InvalidJobError)
        with pytest.raises(ContainerClosedError):
            async with queue.batch() as b:
                inner = b.container("inner", parent=closed)
                b.add("t", parent=inner)
    assert await counts(queue) == before


async def test_cycle_through_container_membership(queue: JobQueue) -> None:
    before = await counts(queue)
    with pytest.raises(DependencyCycleError):
        async with queue.batch() as b:
            site = b.container("site")
            r = b.add("report", depends_on=[site])
            b.add("fetch", parent=site, depends_on=[r])
    with pytest.raises(DependencyCycleError):  # through a nested container and its gate
        async with queue.batch() as b:
            outer = b.container("outer")
            inner = b.container("inner", parent=outer)
            r = b.add("report", depends_on=[outer])
            b.add("fetch", parent=inner, depends_on=[r])
    with pytest.raises(DependencyCycleError):  # a container depending on its own child
        async with queue.batch() as b:
            box = b.container("box")
            child = b.add("t", parent=box)
            b.container("sub", parent=box, depends_on=[child])
            b.add("t", parent=box, depends_on=[box])
    assert await counts(queue) == before


async def test_cycle_with_a_container_already_in_the_database(queue: JobQueue) -> None:
    async with queue.batch() as b:
        site = b.container("site")
        inner = b.container("inner", parent=site)
        b.add("fetch", parent=inner)
        r = b.add("report", depends_on=[site])
        r2 = b.add("after-report", depends_on=[r])
    before = await counts(queue)
    for parent in (site.id, inner.id):
        for upstream in (r.id, r2.id):
            with pytest.raises(DependencyCycleError):
                await queue.enqueue("fetch", parent=parent, depends_on=[upstream])
            with pytest.raises(DependencyCycleError):
                async with queue.batch() as b:
                    sub = b.container("sub", parent=parent)
                    b.add("fetch", parent=sub, depends_on=[upstream])
    assert await counts(queue) == before
    # an unrelated dependency is fine
    ok = await queue.enqueue("fetch", parent=site.id, depends_on=[])
    assert (await queue.get(ok)).parent_id == site.id


@pytest.mark.parametrize(
    "options",
    [
        {"weight": 0}, {"weight": -1}, {"weight": 1.5}, {"timeout": -1.0}, {"timeout": 0},
        {"timeout": math.nan}, {"max_attempts": 0}, {"max_attempts": True}, {"key": ""},
        {"key": "k" * 256}, {"key": 5}, {"priority": "high"}, {"run_after": "soon"},
        {"group": ""}, {"depends_on": [0]}, {"depends_on": [True]}, {"depends_on": [2**70]},
        {"parent": 2**63},
    ],
)
async def test_invalid_options_are_rejected(queue: JobQueue, options: dict[str, Any]) -> None:
    before = await counts(queue)
    with pytest.raises(InvalidJobError):
        await queue.enqueue("t", {}, **options)
    with pytest.raises(InvalidJobError):
        async with queue.batch() as b:
            b.add("t")
            b.add("t", {}, **options)
    assert await counts(queue) == before


async def test_bad_job_type_is_rejected(queue: JobQueue) -> None:
    before = await counts(queue)
    for bad in ("", "x" * 201, None, 3):
        with pytest.raises(InvalidJobError):
            await queue.enqueue(bad)  # type: ignore[arg-type]
    assert await counts(queue) == before


async def test_non_json_result_fails_the_job_clearly(queue: JobQueue) -> None:
    @queue.handler("t", max_attempts=1)
    async def t(ctx: JobContext) -> Any:
        return {"s": {1, 2}}

    jid = await queue.enqueue("t")
    await queue.run_until_idle()
    with pytest.raises(JobFailed) as ei:
        await queue.wait(jid, timeout=5)
    err = ei.value.error
    assert err["type"] == "NotJSONError"
    assert "result" in err["message"] and "JSON" in err["message"]
    assert (await queue.get(jid)).result is None


async def test_dependencies_on_jobs_that_are_finishing_right_now(
    make_queue: Callable[..., JobQueue],
) -> None:
    """Enqueue jobs depending on jobs a worker is finishing at that very moment: the batch
    (which locks the existing rows) and the finalize (which releases dependents) must never
    lose a release (a job stuck waiting) or release too early (started before a dep ended)."""
    producer, worker = make_queue(), make_queue(capacity=8)
    rng = random.Random(7)
    start: dict[int, float] = {}
    end: dict[int, float] = {}

    @worker.handler("w")
    async def w(ctx: JobContext, i: int) -> None:
        start[ctx.job_id] = time.monotonic()
        await asyncio.sleep(rng.random() * 0.01)
        end[ctx.job_id] = time.monotonic()

    await producer.start()
    await worker.start()
    ids = [await producer.enqueue("w", {"i": i}) for i in range(20)]
    deps: dict[int, list[int]] = {}
    server = asyncio.create_task(worker.serve())
    try:
        for i in range(150):
            ups = rng.sample(ids[-30:], k=rng.randint(1, 3))
            jid = await producer.enqueue("w", {"i": 100 + i}, depends_on=ups)
            deps[jid] = ups
            ids.append(jid)
            if i % 10 == 0:
                await asyncio.sleep(0.01)
        for jid in ids:
            await worker.wait(jid, timeout=30)
    finally:
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
    for jid, ups in deps.items():
        for u in ups:
            assert start[jid] >= end[u], (jid, u)

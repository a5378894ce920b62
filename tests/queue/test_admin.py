"""Operator queries (status, listing, DAG view, prune) and hooks, on every database."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta
from typing import Any

import pytest
from conftest import eventually

from aiojobqueue import JobEvent, JobNotFoundError, JobQueue, JobState, SchemaError, admin, prune
from aiojobqueue.errors import InvalidJobError
from aiojobqueue.timeutil import utcnow_plus


async def serve_until_registered(q: JobQueue) -> None:
    """Serve until this worker shows in the registry (its first heartbeat), then stop."""
    task = asyncio.create_task(q.serve())

    async def seen() -> bool:
        st = await admin.status(q)
        return [w.id for w in st.workers] == [q.worker_id] and st.workers[0].seen_ago < 60

    try:
        await eventually(seen, timeout=15)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def add_dead_worker(q: JobQueue, name: str, seen_ago: float) -> None:
    """A registry row as a worker that died ``seen_ago`` seconds ago leaves it."""
    W = q._t.workers

    async def ins(conn: Any) -> None:
        await conn.execute(W.insert().values(
            id=name, host="gone", pid=1, started_at=utcnow_plus(-seen_ago - 10),
            last_seen=utcnow_plus(-seen_ago), running=2))

    await q._write(ins)


async def test_status_counts_groups_ages_and_workers(queue: JobQueue) -> None:
    @queue.handler("work")
    async def work(ctx: Any) -> None:
        return None

    for _ in range(3):
        await queue.enqueue("work", group="a")
    await queue.enqueue("work", group="b")
    await queue.enqueue("nohandler", group="b")  # stays ready: nobody can run it
    await queue.enqueue("nohandler", group="a", run_after=timedelta(hours=1))
    async with queue.batch() as b:
        box = b.container("box", group="a")
        b.add("nohandler", parent=box, group="a")
    await queue.run_until_idle()
    await serve_until_registered(queue)

    st = await admin.status(queue)
    by = {g.group: g for g in st.groups}
    assert by["a"].count("done") == 3 and by["a"].count("ready") == 1
    assert by["a"].count("scheduled") == 1
    assert by["b"].count("done") == 1 and by["b"].count("ready") == 1
    assert st.totals["done"] == 4 and st.totals["ready"] == 2
    assert st.containers == {"active": 1}
    assert by["b"].oldest_ready_age is not None and 0 <= by["b"].oldest_ready_age < 60
    assert st.oldest_ready_age is not None
    assert st.workers == [] and st.stale_workers == 0  # a clean exit deregisters
    await add_dead_worker(queue, "dead", seen_ago=120)
    st = await admin.status(queue)
    assert st.workers == [] and st.stale_workers == 1
    st = await admin.status(queue, recent=300)
    # running is what the worker holds in the jobs table (the same snapshot as the groups),
    # not the number its last heartbeat wrote (2): a dead worker whose jobs were reclaimed
    # runs nothing
    assert [(w.id, w.running) for w in st.workers] == [("dead", 0)]
    assert 100 < st.workers[0].seen_ago < 200


async def test_list_jobs_filters_and_rejects_bad_state(queue: JobQueue) -> None:
    a = await queue.enqueue("x", group="g1")
    b = await queue.enqueue("y", group="g2", depends_on=[a])
    jobs = await admin.list_jobs(queue)
    assert [j.id for j in jobs] == [b, a]  # newest first
    assert [j.id for j in await admin.list_jobs(queue, state="waiting")] == [b]
    assert [j.id for j in await admin.list_jobs(queue, group="g1")] == [a]
    assert [j.id for j in await admin.list_jobs(queue, limit=1)] == [b]
    assert (await admin.list_jobs(queue, state="waiting"))[0].depends_on == (a,)
    with pytest.raises(InvalidJobError, match="unknown state 'bogus'"):
        await admin.list_jobs(queue, state="bogus")


async def test_graph_shows_ancestry_children_deps_and_dependents(queue: JobQueue) -> None:
    async with queue.batch() as b:
        outer = b.container("outer")
        inner = b.container("inner", parent=outer)
        x = b.add("x", parent=inner)
        y = b.add("y", parent=inner, depends_on=[x])
        z = b.add("z", depends_on=[outer])
    g = await admin.graph(queue, y.id)
    assert [j.id for j in g.ancestors] == [outer.id, inner.id]
    assert [j.id for j in g.dependencies] == [x.id]
    assert g.dependents == [] and g.children == []
    g = await admin.graph(queue, inner.id)
    assert [j.id for j in g.children] == [x.id, y.id] and g.children_total == 2
    g = await admin.graph(queue, outer.id)
    assert [j.id for j in g.dependents] == [z.id] and g.dependents_total == 1
    with pytest.raises(JobNotFoundError):
        await admin.graph(queue, 10**9)


def test_parse_age() -> None:
    assert prune.parse_age("30m") == timedelta(minutes=30)
    assert prune.parse_age("12h") == timedelta(hours=12)
    assert prune.parse_age("7d") == timedelta(days=7)
    assert prune.parse_age("1d12h") == timedelta(days=1, hours=12)
    assert prune.parse_age("1.5h") == timedelta(minutes=90)
    assert prune.parse_age("0s") == timedelta(0)
    for bad in ("", "7", "d", "7x", "-1d", "7d junk", "1h-2m"):
        with pytest.raises(InvalidJobError, match="bad age"):
            prune.parse_age(bad)


async def test_prune_keeps_dag_integrity(queue: JobQueue) -> None:
    @queue.handler("ok")
    async def ok(ctx: Any) -> str:
        return "ok"

    async with queue.batch() as b:
        old_box = b.container("old")  # a finished tree: goes whole
        k1 = b.add("ok", parent=old_box)
        k2 = b.add("ok", parent=old_box, depends_on=[k1])
        needed = b.add("ok")  # done, but a live job depends on it: stays
        b.add("nohandler", depends_on=[needed])
        live_box = b.container("live")  # a live container: its done child stays
        kid = b.add("ok", parent=live_box)
        b.add("nohandler", parent=live_box)
    await queue.run_until_idle()
    assert (await queue.get(old_box.id)).state == JobState.DONE

    nothing = await prune.prune(queue, timedelta(hours=1))
    assert (nothing.jobs, nothing.edges) == (0, 0)
    dry = await prune.prune(queue, timedelta(0), dry_run=True)
    assert (dry.jobs, dry.edges, dry.kept) == (3, 1, 1)
    await queue.get(k1.id)  # a dry run deletes nothing

    res = await prune.prune(queue, timedelta(0))
    assert (res.jobs, res.edges, res.kept) == (3, 1, 1)
    for gone in (old_box.id, k1.id, k2.id):
        with pytest.raises(JobNotFoundError):
            await queue.get(gone)
    assert (await queue.get(needed.id)).state == JobState.DONE
    assert (await queue.get(kid.id)).state == JobState.DONE
    again = await prune.prune(queue, timedelta(0))
    assert again.jobs == 0 and again.kept == 1


async def test_prune_removes_stale_workers(queue: JobQueue) -> None:
    await add_dead_worker(queue, "old", seen_ago=7200)
    await add_dead_worker(queue, "recent", seen_ago=60)
    assert (await admin.status(queue)).stale_workers == 2
    assert (await prune.prune(queue, timedelta(hours=3))).workers == 0
    assert (await prune.prune(queue, timedelta(hours=1), dry_run=True)).workers == 1
    assert (await prune.prune(queue, timedelta(hours=1))).workers == 1
    assert (await admin.status(queue)).stale_workers == 1


async def test_start_without_migrate_refuses_a_missing_schema(make_queue: Any) -> None:
    q = make_queue()
    with pytest.raises(SchemaError, match="aiojobqueue migrate"):
        await q.start(migrate=False)
    async with q:
        pass
    q2 = make_queue()
    await q2.start(migrate=False)  # now it is there
    await q2.close()


async def test_hooks_tell_retry_from_final_failure(
    queue: JobQueue, caplog: pytest.LogCaptureFixture
) -> None:
    events: list[JobEvent] = []
    for name in ("start", "done", "retry", "failed"):
        queue.on(name, events.append)

    @queue.handler("flaky", max_attempts=3)
    async def flaky(ctx: Any) -> int:
        if ctx.attempt == 1:
            raise ValueError("first try fails")
        return ctx.attempt

    @queue.handler("doomed", max_attempts=2)
    async def doomed(ctx: Any) -> None:
        raise RuntimeError("always")

    caplog.set_level(logging.INFO, logger="aiojobqueue")
    f = await queue.enqueue("flaky")
    d = await queue.enqueue("doomed")
    await queue.run_until_idle()
    seq = {jid: [e.event for e in events if e.job_id == jid] for jid in (f, d)}
    assert seq[f] == ["start", "retry", "start", "done"]
    assert seq[d] == ["start", "retry", "start", "failed"]
    retry = next(e for e in events if e.event == "retry" and e.job_id == f)
    assert retry.error is not None and retry.error["type"] == "ValueError"
    assert retry.retry_in is not None and retry.duration is not None
    assert retry.attempt == 1 and retry.worker_id == queue.worker_id
    done = next(e for e in events if e.event == "done")
    assert done.attempt == 2 and done.type == "flaky" and done.group == "default"

    recs = [r for r in caplog.records if getattr(r, "job_id", None) in (f, d)]
    assert {r.levelname for r in recs} >= {"INFO", "WARNING", "ERROR"}
    for r in recs:
        assert r.job_type in ("flaky", "doomed")  # type: ignore[attr-defined]
        assert r.attempt in (1, 2) and r.worker == queue.worker_id  # type: ignore[attr-defined]


async def test_job_records_and_hooks_each_on_their_own(
    queue: JobQueue, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker builds a job's events only for a reader (per job, on the hot path): with
    no hook, an enabled log level still gets its records; with logging quiet, a hook still
    gets its events."""
    @queue.handler("t")
    async def t(ctx: Any) -> None:
        return None

    jlog = logging.getLogger("aiojobqueue.jobs")
    caplog.set_level(logging.DEBUG, logger="aiojobqueue")
    first = await queue.enqueue("t")
    await queue.run_until_idle()
    recs = [r.getMessage() for r in caplog.records if getattr(r, "job_id", None) == first]
    assert any(m.endswith("started") for m in recs) and any(" done in " in m for m in recs)

    caplog.clear()
    events: list[JobEvent] = []
    queue.on("start", events.append)
    queue.on("done", events.append)
    caplog.set_level(logging.ERROR, logger="aiojobqueue")
    assert not jlog.isEnabledFor(logging.INFO)
    second = await queue.enqueue("t")
    await queue.run_until_idle()
    assert [(e.event, e.job_id) for e in events] == [("start", second), ("done", second)]
    assert not [r for r in caplog.records if getattr(r, "job_id", None) == second]


async def test_a_raising_hook_never_hurts_the_job(queue: JobQueue) -> None:
    def boom(ev: JobEvent) -> None:
        raise RuntimeError("bad hook")

    queue.on("start", boom)
    queue.on("done", boom)
    with pytest.raises(ValueError, match="unknown hook event"):
        queue.on("finished", boom)

    @queue.handler("ok")
    async def ok(ctx: Any) -> int:
        return 1

    j = await queue.enqueue("ok")
    await queue.run_until_idle()
    assert await queue.wait(j, timeout=5) == 1


async def test_a_dead_workers_attempt_is_reported_once_by_the_reclaimer(
    make_queue: Any,
) -> None:


    dead = make_queue(lease_ttl=1.0, heartbeat_interval=0.3)
    alive = make_queue(lease_ttl=1.0, heartbeat_interval=0.3)
    events: list[JobEvent] = []
    for name in ("start", "retry", "done"):
        alive.on(name, events.append)

    @alive.handler("x", max_attempts=3)
    async def x(ctx: Any) -> int:
        return ctx.attempt

    async with dead, alive:
        jid = await dead.enqueue("x")
        # "dead" leases the job and never heartbeats or finishes it: a crashed worker
        (c,) = await dead._write(lambda conn: dead._core.claimer.claim(conn, 1, ["x"]))
        assert c.id == jid
        await alive.run_until_idle()
        assert await alive.wait(jid, timeout=10) == 2
    got = [(e.event, e.attempt, e.reclaimed) for e in events]
    assert got == [("retry", 1, True), ("start", 2, False), ("done", 2, False)]
    assert events[0].worker_id == dead.worker_id  # the attempt's own worker
    assert events[0].error is not None and events[0].error["type"] == "LeaseExpired"

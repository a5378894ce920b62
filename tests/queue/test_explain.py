"""``queue.explain()`` on every database: each reason code of the SPEC, through the public
API, with real workers registering the types they serve; and the status helpers."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from conftest import eventually
from finalizekit import serving
from sqlalchemy import insert, select, text, update

from aiojobqueue import Explanation, JobContext, JobNotFoundError, JobQueue, Limit, RateLimit
from aiojobqueue.explanation import CODES
from aiojobqueue.fleet import GroupAtCap, groups_at_cap, notes, unserved_types
from aiojobqueue.schema import SCHEMA_VERSION


def blocking(q: JobQueue, type: str = "t", **options: Any) -> asyncio.Event:
    """A handler of ``type`` that runs until the returned event is set."""
    gate = asyncio.Event()

    @q.handler(type, **options)
    async def run(ctx: JobContext) -> None:
        await gate.wait()

    return gate


async def codes_become(q: JobQueue, jid: int, *codes: str) -> Explanation:
    got: list[Explanation] = []

    async def check() -> bool:
        got[:] = [await q.explain(jid)]
        return got[0].codes == list(codes)

    try:
        await eventually(check, timeout=15)
    except AssertionError:
        raise AssertionError(f"explain({jid}) never became {codes}: {got[0]}") from None
    return got[0]


async def test_terminal_and_unknown(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()

    @q.handler("ok")
    async def ok(ctx: JobContext) -> int:
        return 1

    @q.handler("bad", max_attempts=1)
    async def bad(ctx: JobContext) -> None:
        raise ValueError("nope")

    async with q:
        a, b = await q.enqueue("ok"), await q.enqueue("bad")
        await q.run_until_idle()
        ea, eb = await q.explain(a), await q.explain(b)
        assert ea.codes == ["terminal"] and ea.reasons[0].data["state"] == "done"
        assert eb.codes == ["terminal"] and "ValueError: nope" in str(eb)
        assert str(ea).startswith(f"Job {a} (ok, group 'default') is done.")
        for missing in (10**9, 0, "x"):
            try:
                await q.explain(missing)  # type: ignore[arg-type]
            except JobNotFoundError:
                pass
            else:
                raise AssertionError(f"explain({missing!r}) did not raise")


async def test_running_names_worker_and_attempt(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()
    gate = blocking(q)
    async with q, serving(q):
        jid = await q.enqueue("t")
        e = await codes_become(q, jid, "running")
        r = e.reasons[0]
        assert r.data["worker"] == q.worker_id and r.data["attempt"] == 1
        assert q.worker_id in str(e)
        gate.set()
        await q.wait(jid, timeout=15)


async def test_waiting_on_names_unfinished_jobs_through_containers(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue()
    async with q:
        a = await q.enqueue("t")
        async with q.batch() as b:
            box = b.container("box")
            c1 = b.add("t", {}, parent=box)
            c2 = b.add("t", {}, parent=box, depends_on=[c1])
            inner = b.container("inner", parent=box)
            c3 = b.add("t", {}, parent=inner)
            r = b.add("t", {}, depends_on=[box, a])
            late = b.container("late", depends_on=[a])
            x = b.add("t", {}, parent=late)
        er = await q.explain(r.id)
        assert er.codes == ["waiting_on"]
        data = er.reasons[0].data
        assert data["direct"] == sorted([box.id, a])
        assert data["ids"] == sorted([a, box.id, c1.id, c2.id, c3.id])
        # a job whose container waits: it waits on the container's dependencies
        ex = await q.explain(x.id)
        assert ex.codes == ["waiting_on"] and ex.reasons[0].data["ids"] == [a]
        assert f"It waits on job {a}, which has not finished." in str(ex)
        # an active container waits on its unfinished members
        eb = await q.explain(box.id)
        assert eb.codes == ["waiting_on"]
        assert eb.reasons[0].data["ids"] == sorted([c1.id, c2.id, c3.id])


async def test_scheduled_and_backoff(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue(retry_backoff=120.0, retry_backoff_max=120.0)

    @q.handler("flaky", max_attempts=3)
    async def flaky(ctx: JobContext) -> None:
        raise OSError("down")

    async with q:
        later = await q.enqueue("flaky", run_after=timedelta(hours=1))
        e = await q.explain(later)
        assert e.codes == ["scheduled"]
        when = e.reasons[0].data["when"]
        assert timedelta(minutes=59) < when - datetime.now(UTC) <= timedelta(hours=1)
        jid = await q.enqueue("flaky")
        async with serving(q):
            e = await codes_become(q, jid, "backoff")
        r = e.reasons[0]
        assert r.data["attempt"] == 1 and r.data["error"]["type"] == "OSError"
        assert timedelta(seconds=50) < r.data["when"] - datetime.now(UTC) < timedelta(seconds=121)
        assert "OSError: down" in str(e)
        d = json.loads(json.dumps(e.to_dict()))
        assert d["reasons"][0]["code"] == "backoff" and d["text"] == str(e)
        assert datetime.fromisoformat(d["reasons"][0]["data"]["when"]) == r.data["when"]


async def test_no_worker_serves_the_type(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()
    blocking(q, "served")
    async with q:
        jid = await q.enqueue("nobody")
        e = await q.explain(jid)
        assert e.codes == ["no_worker"] and e.reasons[0].data["live_workers"] == 0
        assert await unserved_types(q) == {"nobody": 1}
        assert await notes(q) == ["type 'nobody': 1 runnable job(s) and no live worker serves it"]
        async with serving(q):
            async def registered() -> bool:
                return (await q.explain(jid)).reasons[0].data.get("live_workers") == 1

            await eventually(registered, timeout=15)
            e = await q.explain(jid)
            assert e.codes == ["no_worker"] and "'nobody'" in str(e)
            assert await unserved_types(q) == {"nobody": 1}
            served = await q.enqueue("served")
            await codes_become(q, served, "running")
            assert await unserved_types(q) == {"nobody": 1}


async def test_global_cap(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue(concurrency=1)
    gate = blocking(q)
    async with q, serving(q):
        first = await q.enqueue("t")
        await codes_become(q, first, "running")
        second = await q.enqueue("t")
        e = await codes_become(q, second, "global_cap")
        assert e.reasons[0].data == {"cap": 1, "running": 1}
        assert "1 of 1" in str(e)
        gate.set()
        await q.wait(second, timeout=15)


async def test_group_cap_seen_from_a_queue_without_the_setting(
    make_queue: Callable[..., JobQueue],
) -> None:
    """The cap a live worker enforces is registered with it: a plain queue (the command
    line's) explains it too, and status lists the group."""
    q = make_queue(group_limits={"g": 1})
    gate = blocking(q)
    look = make_queue()  # no caps, no handlers: only the URL
    async with q, look, serving(q):
        first = await q.enqueue("t", group="g")
        await codes_become(q, first, "running")
        second = await q.enqueue("t", group="g")
        other = await q.enqueue("t", group="h")
        await codes_become(q, other, "running")
        for who in (q, look):
            e = await codes_become(who, second, "group_cap")
            assert e.reasons[0].data == {"group": "g", "cap": 1, "running": 1}
            assert await groups_at_cap(who) == [GroupAtCap("g", 1, 1, 1)]
            assert await notes(who) == ["group 'g' is at its cap: 1 of 1 running, 1 ready"]
        gate.set()
        await q.wait(second, timeout=15)


async def test_rate_limit_says_when_the_next_slot_opens(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue(limits=[RateLimit(1, per=60.0, name="api")])

    @q.handler("t")
    async def t(ctx: JobContext) -> None:
        return None

    async with q, serving(q):
        first = await q.enqueue("t")
        await q.wait(first, timeout=15)
        started = (await q.get(first)).started_at
        assert started is not None
        second = await q.enqueue("t")
        e = await codes_become(q, second, "rate_limit")
        data = e.reasons[0].data
        assert (data["name"], data["n"], data["per"]) == ("api", 1, 60.0)
        assert abs((data["next_at"] - (started + timedelta(seconds=60))).total_seconds()) < 2


async def test_rate_limit_next_slot_counts_the_starts_of_each_claim(
    make_queue: Callable[..., JobQueue],
) -> None:
    """The ledger holds one row per claim with its ``starts`` (schema v8): the window of
    RateLimit(5, per=60) holding claims of 2, 2 and 3 starts (30, 20 and 10 s ago) is used
    up, and its next slot opens when the claim of 20 s ago ages out (newest first, 3 + 2
    reach 5; once that row leaves, 3 stay)."""
    from aiojobqueue.explain import _next_rate_slot
    from aiojobqueue.timeutil import db_now, utcnow_plus

    lim = RateLimit(5, per=60.0, name="api")
    q = make_queue(limits=[lim])
    blocking(q)
    async with q:
        R = q._t.rate
        async with q.engine.begin() as conn:
            for ago, k in ((30, 2), (20, 2), (10, 3), (90, 4)):  # the last out of the window
                await conn.execute(insert(R).values(name="api", at=utcnow_plus(-ago), starts=k))
        async with q.engine.connect() as conn:
            now = (await conn.execute(select(db_now()))).scalar_one()
            assert await lim.budget(conn, q._t) == 0
            opens = await _next_rate_slot(q._started().db, conn, lim)
    async with q, serving(q):
        jid = await q.enqueue("t")
        assert opens is not None
        assert abs((opens - (now + timedelta(seconds=40))).total_seconds()) < 2, (opens, now)
        e = await codes_become(q, jid, "rate_limit")
        assert abs((e.reasons[0].data["next_at"] - opens).total_seconds()) < 1e-3


class Closed(Limit):
    async def available(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "Closed()"


async def test_custom_limit(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue(limits=[Closed()])
    blocking(q)
    async with q, serving(q):
        jid = await q.enqueue("t")
        e = await codes_become(q, jid, "limit")
        assert e.reasons[0].data == {"limit": "Closed()"}


async def test_fair_share_and_next_in_line(make_queue: Callable[..., JobQueue]) -> None:
    """One slot, busy with group a: the next slot is owed to group b, so a's second job is
    held by fair share and b's job is ready, next in line."""
    q = make_queue(capacity=1)
    gate = blocking(q)
    async with q, serving(q):
        a1 = await q.enqueue("t", group="a")
        await codes_become(q, a1, "running")
        a2 = await q.enqueue("t", group="a")
        b1 = await q.enqueue("t", group="b")
        e = await codes_become(q, a2, "fair_share")  # once the beat registered running=1
        assert e.reasons[0].data == {"group": "a", "running": 1, "weight": 1, "ahead": ["b"]}
        e = await q.explain(b1)
        assert e.codes == ["ready"]
        assert e.reasons[0].data == {"ahead_in_group": 0, "workers_busy": True}
        gate.set()
        await q.wait(a2, timeout=15)


async def test_fair_share_ties_follow_the_claims_rotation(
    make_queue: Callable[..., JobQueue],
) -> None:
    """Equal ratios are decided by the claim's rotation, not by weight. One slot, busy with
    group m (the last group served, so the rotation goes on after m): of the idle groups a
    (weight 3) and z (weight 1), z is owed the next slot, so a is held by fair share, and
    the claim then starts z before a."""
    q = make_queue(capacity=1)
    gate = asyncio.Event()
    started: list[int] = []

    @q.handler("t")
    async def run(ctx: JobContext) -> None:
        started.append(ctx.job_id)
        await gate.wait()

    async with q, serving(q):
        m = await q.enqueue("t", group="m")
        await codes_become(q, m, "running")
        a = await q.enqueue("t", group="a", weight=3)
        z = await q.enqueue("t", group="z")
        e = await codes_become(q, a, "fair_share")  # once the beat registered running=1
        assert e.reasons[0].data == {"group": "a", "running": 0, "weight": 3, "ahead": ["z"]}
        e = await q.explain(z)
        assert e.codes == ["ready"]
        assert e.reasons[0].data == {"ahead_in_group": 0, "workers_busy": True}
        gate.set()
        await q.wait(a, timeout=15)
    assert started == [m, z, a]


async def test_ready_when_nothing_holds_it(make_queue: Callable[..., JobQueue]) -> None:
    """A live worker elsewhere serves the type and has room (its registry row, as its
    heartbeat writes it): nothing holds the job; the jobs ahead of it in its group count."""
    q = make_queue()
    async with q:
        W = q._t.workers
        async with q.engine.begin() as conn:
            now = datetime.now(UTC)
            await conn.execute(insert(W).values(
                id="elsewhere", host=socket.gethostname(), pid=os.getpid(), started_at=now,
                last_seen=now, running=0, types=["t"], capacity=4, config={}))
        first = await q.enqueue("t", priority=5)
        jid = await q.enqueue("t")
        e = await q.explain(jid)
        assert e.codes == ["ready"]
        assert e.reasons[0].data == {"ahead_in_group": 1, "workers_busy": False}
        assert "1 job(s) of its group come first" in str(e)
        assert (await q.explain(first)).reasons[0].data["ahead_in_group"] == 0
        assert await unserved_types(q) == {}
        # a worker not seen for longer than the lease is not live
        async with q.engine.begin() as conn:
            await conn.execute(update(W).values(last_seen=now - timedelta(seconds=60)))
        assert (await q.explain(jid)).codes == ["no_worker"]
        assert set(CODES) >= {"ready", "no_worker"}


async def test_workers_register_types_capacity_and_caps(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue(capacity=3, concurrency=7, group_limits={"g": 2},
                   limits=[RateLimit(5, per=2.0, name="r")])
    blocking(q, "x")
    blocking(q, "y")
    async with q:
        W = q._t.workers

        async def row() -> Any:
            async with q.engine.connect() as conn:
                return (await conn.execute(select(W).where(W.c.id == q.worker_id))).first()

        async with serving(q):
            await eventually(row, timeout=15)
            w = await row()
        assert w.types == ["x", "y"] and w.capacity == 3
        assert w.config == {"concurrency": 7, "group_limits": {"g": 2},
                            "rate_limits": [{"name": "r", "n": 5, "per": 2.0}]}


async def test_v5_schema_gains_the_v6_columns(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()
    async with q:
        J, W, M = q._t.jobs, q._t.workers, q._t.meta
        jid = await q.enqueue("t")
        async with q.engine.begin() as conn:
            for table, cols in ((J, ("progress", "errors")),
                                (W, ("types", "capacity", "config"))):
                for c in cols:
                    await conn.execute(text(f"ALTER TABLE {table.name} DROP COLUMN {c}"))
            await conn.execute(update(M).where(M.c.name == "schema_version").values(value="5"))
    q2 = make_queue()

    @q2.handler("t", max_attempts=2)
    async def t(ctx: JobContext) -> None:
        await ctx.progress(1, 1)
        if ctx.attempt == 1:
            raise RuntimeError("once")

    async with q2:
        async with q2.engine.connect() as conn:
            v = (await conn.execute(select(M.c.value).where(M.c.name == "schema_version"))
                 ).scalar_one()
        assert v == str(SCHEMA_VERSION)
        await q2.run_until_idle()
        job = await q2.get(jid)
    assert job.state == "done" and [e["attempt"] for e in job.errors] == [1]
    assert job.progress is not None and job.progress["done"] == 1

"""The claim follows the stored policy: caps, the "*" default cap, stored weights, per-group
rates, pauses by group, type and queue, read from the database by a worker that declares
nothing (so none of it can come from its own settings)."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from conftest import eventually
from sqlalchemy import func, select

from aiojobqueue import JobQueue, RateLimit


class Meter:
    """Attempts running now and the most at once: overall and per group."""

    def __init__(self) -> None:
        self.now: dict[str, int] = defaultdict(int)
        self.peak: dict[str, int] = defaultdict(int)
        self.total = self.total_peak = 0
        self.done: dict[str, int] = defaultdict(int)

    async def run(self, group: str, seconds: float) -> None:
        self.now[group] += 1
        self.total += 1
        self.peak[group] = max(self.peak[group], self.now[group])
        self.total_peak = max(self.total_peak, self.total)
        try:
            await asyncio.sleep(seconds)
        finally:
            self.now[group] -= 1
            self.total -= 1
        self.done[group] += 1


def metered(q: JobQueue, meter: Meter, seconds: float = 0.03) -> None:
    @q.handler("w")
    async def w(ctx: Any) -> None:
        await meter.run(ctx.group, seconds)

    @q.handler("other")
    async def other(ctx: Any) -> None:
        await meter.run("type:other", seconds)


async def fill(q: JobQueue, counts: dict[str, int], type: str = "w") -> None:
    async with q.batch() as b:
        for g, n in counts.items():
            for _ in range(n):
                b.add(type, {}, group=g)


async def ready_count(q: JobQueue, **where: str) -> int:
    J = q._t.jobs
    cond = [J.c.state == "ready"] + [getattr(J.c, k) == v for k, v in where.items()]
    return int(await q._read(lambda conn: _scalar(conn, select(func.count()).select_from(J)
                                                  .where(*cond))))


async def _scalar(conn: Any, stmt: Any) -> Any:
    return (await conn.execute(stmt)).scalar_one()


async def test_caps_come_from_the_database(make_queue: Callable[..., JobQueue]) -> None:
    """A global cap of 3 and a cap of 1 on group "a", stored by one queue, hold for a worker
    of capacity 8 that declares nothing."""
    admin = make_queue()
    async with admin:
        await admin.set_policy(concurrency=3)
        await admin.set_group("a", cap=1)
        q = make_queue(capacity=8)
        meter = Meter()
        metered(q, meter)
        async with q:
            await fill(q, {"a": 8, "b": 8, "c": 8})
            await q.run_until_idle()
    assert sum(meter.done.values()) == 24
    assert meter.total_peak == 3 and meter.peak["a"] == 1


async def test_default_row_caps_every_group_without_its_own(
    make_queue: Callable[..., JobQueue],
) -> None:
    """"*" cap 1: each group runs one at a time, several groups at once; a group with its
    own row (cap 3) takes its own."""
    q = make_queue(capacity=10)
    meter = Meter()
    metered(q, meter)
    async with q:
        await q.set_group("*", cap=1)
        await q.set_group("big", cap=3)
        await fill(q, {"x": 6, "y": 6, "z": 6, "big": 12})
        await q.run_until_idle()
    assert sum(meter.done.values()) == 30
    assert meter.peak["x"] == meter.peak["y"] == meter.peak["z"] == 1
    assert meter.peak["big"] == 3
    assert meter.total_peak > 3  # the groups ran beside each other


async def test_stored_weight_splits_the_slots(make_queue: Callable[..., JobQueue]) -> None:
    """Two groups with deep backlogs of weight-1 jobs under concurrency=4: 2 and 2 by
    default; with a stored weight of 3 for "heavy", 3 and 1."""
    q = make_queue(concurrency=4, capacity=4, poll_interval=5.0)
    async with q:
        await fill(q, {"heavy": 20, "light": 20})
        claimer = q._core.claimer
        first = await q._write(lambda conn: claimer.claim(conn, 4, ["w"]))
        assert sorted(c.group for c in first) == ["heavy", "heavy", "light", "light"]
        await q._write(lambda conn: conn.execute(
            q._t.jobs.update().where(q._t.jobs.c.state == "running").values(state="ready")))
        await q.set_group("heavy", weight=3)
        await claimer.live.refresh(q._core.db)
        again = await q._write(lambda conn: claimer.claim(conn, 4, ["w"]))
        assert sorted(c.group for c in again) == ["heavy", "heavy", "heavy", "light"]


async def test_per_group_rate(make_queue: Callable[..., JobQueue]) -> None:
    """"slow" may start 4 jobs a minute; "fast" is not limited: all of fast's jobs run,
    4 of slow's, and the other 6 stay ready. A "*" rate limits a group with no row."""
    q = make_queue(capacity=10)
    meter = Meter()
    metered(q, meter, 0.01)
    async with q:
        await q.set_group("slow", rate=RateLimit(4, per=60.0))
        await fill(q, {"slow": 10, "fast": 10})
        task = asyncio.create_task(q.serve())
        try:
            await eventually(lambda: meter.done["fast"] == 10 and meter.done["slow"] == 4,
                             timeout=30)
            await asyncio.sleep(0.5)  # several more claims: still 4
            assert meter.done["slow"] == 4 and await ready_count(q, group_key="slow") == 6
            await q.set_group("*", rate=RateLimit(2, per=60.0))
            await fill(q, {"nobody": 5})
            await eventually(lambda: meter.done["nobody"] == 2, timeout=30)
            await asyncio.sleep(0.5)
            assert meter.done["nobody"] == 2 and meter.done["slow"] == 4
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_pause_and_resume_group_type_and_queue(
    make_queue: Callable[..., JobQueue],
) -> None:
    """A paused group or type keeps its jobs ready and starts none while the rest runs; a
    paused queue starts nothing; resume lets them run."""
    q = make_queue(capacity=4)
    meter = Meter()
    metered(q, meter, 0.01)
    async with q:
        await q.pause(group="held")
        await q.pause(type="other")
        await fill(q, {"held": 5, "free": 5})
        await fill(q, {"free": 3}, type="other")
        task = asyncio.create_task(q.serve())
        try:
            await eventually(lambda: meter.done["free"] == 5, timeout=30)
            await asyncio.sleep(0.3)
            assert meter.done["held"] == 0 and meter.done["type:other"] == 0
            assert await ready_count(q, group_key="held") == 5
            assert await ready_count(q, type="other") == 3
            await q.pause()  # the whole queue
            await q.resume(group="held")
            await q.resume(type="other")
            await asyncio.sleep(0.3)
            assert meter.done["held"] == 0 and meter.done["type:other"] == 0
            await q.resume()
            await eventually(lambda: meter.done["held"] == 5 and meter.done["type:other"] == 3,
                             timeout=30)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_a_running_job_of_a_paused_group_finishes(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue(capacity=1)
    started, release = asyncio.Event(), asyncio.Event()

    @q.handler("w")
    async def w(ctx: Any) -> str:
        started.set()
        await release.wait()
        return "ok"

    async with q:
        jid = await q.enqueue("w", {}, group="g")
        nxt = await q.enqueue("w", {}, group="g")
        task = asyncio.create_task(q.serve())
        try:
            await asyncio.wait_for(started.wait(), 10)
            await q.pause(group="g")
            release.set()
            assert await q.wait(jid, timeout=10) == "ok"
            await asyncio.sleep(0.3)
            assert (await q.get(nxt)).state.value == "ready"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_change_reaches_a_serving_worker_within_poll_interval(
    make_queue: Callable[..., JobQueue], db: str,
) -> None:
    """A pause stored by another queue reaches a serving worker (poll_interval 0.3 s) within
    its poll_interval (at once on PostgreSQL: NOTIFY)."""
    w = make_queue(poll_interval=0.3)
    metered(w, Meter())
    admin = make_queue()
    async with w, admin:
        task = asyncio.create_task(w.serve())
        try:
            await asyncio.sleep(0.5)  # serving, idle
            live = w._core.claimer.live
            t0 = time.monotonic()
            await admin.pause(group="g")
            await eventually(lambda: live.cap("g") == 0, timeout=5, every=0.005)
            took = time.monotonic() - t0
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    print(f"{db}: the change reached the worker in {took:.3f}s")
    assert took < 0.3 + 0.25  # poll_interval, with room for this loaded machine


async def test_declarations_written_where_they_differ_and_logged(
    make_queue: Callable[..., JobQueue], caplog: Any,
) -> None:
    """Constructor arguments declare the policy: written at start where they differ from
    what is stored (logged with the old and the new value); the same declaration again
    writes nothing; a queue declaring nothing changes nothing."""
    import logging

    caplog.set_level(logging.INFO, logger="aiojobqueue.policy")
    q1 = make_queue(concurrency=3, group_limits={"a": 1}, limits=[RateLimit(10, per=2.0)])
    async with q1:
        p = await q1.policy()
        version = await q1._read(lambda conn: _version(q1, conn))
    assert p.concurrency == 3 and p.group("a").cap == 1
    assert p.rate == RateLimit(10, per=2.0)
    said = [r.getMessage() for r in caplog.records if r.name == "aiojobqueue.policy"]
    assert "policy: concurrency None -> 3 (declared)" in said
    assert "policy: group 'a' cap None -> 1 (declared)" in said
    assert "policy: rate None -> 10/2s (declared)" in said
    caplog.clear()
    q2 = make_queue(concurrency=3, group_limits={"a": 1}, limits=[RateLimit(10, per=2.0)])
    async with q2:
        assert await q2._read(lambda conn: _version(q2, conn)) == version  # nothing written
    q3 = make_queue()
    async with q3:
        assert await q3.policy() == p
        await q3.set_group("a", cap=4)  # a runtime change ...
    q4 = make_queue(concurrency=5)
    async with q4:  # ... stays, and the last declaration wins where it declares
        p4 = await q4.policy()
    assert p4.concurrency == 5 and p4.group("a").cap == 4
    said = [r.getMessage() for r in caplog.records if r.name == "aiojobqueue.policy"]
    assert said == ["policy: concurrency 3 -> 5 (declared)"]


async def _version(q: JobQueue, conn: Any) -> Any:
    M = q._t.meta
    return (await conn.execute(select(M.c.value).where(M.c.name == "policy_version"))).scalar()


async def test_explain_and_status_see_the_stored_caps(
    make_queue: Callable[..., JobQueue],
) -> None:
    """explain() of a job held by the "*" cap names the group cap; status's notes name the
    group at its cap; a stored global cap set at runtime is the one explain counts."""
    from aiojobqueue.fleet import groups_at_cap

    q = make_queue(capacity=4)
    started, release = asyncio.Event(), asyncio.Event()

    @q.handler("w")
    async def w(ctx: Any) -> None:
        started.set()
        await release.wait()

    async with q:
        await q.set_group("*", cap=1)
        await q.enqueue("w", {}, group="g")
        waiting = await q.enqueue("w", {}, group="g")
        task = asyncio.create_task(q.serve())
        try:
            await asyncio.wait_for(started.wait(), 10)
            reasons = {r.code: r.data for r in (await q.explain(waiting)).reasons}
            assert reasons["group_cap"]["cap"] == 1
            assert [(g.group, g.cap) for g in await groups_at_cap(q)] == [("g", 1)]
            await q.set_policy(concurrency=1)  # (first: the job must stay held)
            await q.set_group("*", cap=None)
            reasons = {r.code: r.data for r in (await q.explain(waiting)).reasons}
            assert reasons["global_cap"]["cap"] == 1 and "group_cap" not in reasons
        finally:
            release.set()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

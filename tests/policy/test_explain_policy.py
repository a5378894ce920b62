"""``explain()`` reads the stored policy on every database: the reason ``paused`` (the
whole queue, a group or a type; data says which), and the caps and rates of the policy
table, seen from a queue that has no settings of its own (as the command line's)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from conftest import eventually
from finalizekit import serving

from aiojobqueue import JobContext, JobQueue, RateLimit
from aiojobqueue.explanation import CODES
from aiojobqueue.fleet import GroupAtCap, groups_at_cap


def paused(e: object) -> list[dict[str, str]]:
    return [r.data for r in e.reasons if r.code == "paused"]  # type: ignore[attr-defined]


async def test_paused_says_which_pause_holds_the_job(
        make_queue: Callable[..., JobQueue]) -> None:
    assert "paused" in CODES
    look = make_queue()  # no settings, no handlers: only the URL
    async with look:
        a = await look.enqueue("fetch", group="tenant-a")
        b = await look.enqueue("parse", group="tenant-b")
        assert paused(await look.explain(a)) == []
        await look.pause(group="tenant-a")
        e = await look.explain(a)
        assert paused(e) == [{"scope": "group", "name": "tenant-a"}]
        assert "Group 'tenant-a' is paused" in str(e)
        assert paused(await look.explain(b)) == []  # another group: not held
        await look.pause(type="fetch")
        await look.pause()
        assert paused(await look.explain(a)) == [
            {"scope": "queue", "name": ""}, {"scope": "group", "name": "tenant-a"},
            {"scope": "type", "name": "fetch"}]
        assert paused(await look.explain(b)) == [{"scope": "queue", "name": ""}]
        assert "The whole queue is paused" in str(await look.explain(b))
        for kw in ({"group": "tenant-a"}, {"type": "fetch"}, {}):
            await look.resume(**kw)
        assert paused(await look.explain(a)) == []
        assert "paused" not in (await look.explain(a)).codes


async def test_caps_and_rates_come_from_the_stored_policy(
        make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue(capacity=1)
    gate = asyncio.Event()

    @q.handler("t")
    async def run(ctx: JobContext) -> None:
        await gate.wait()

    look = make_queue()  # no caps of its own
    async with q, look, serving(q):
        first = await q.enqueue("t", group="g")
        async def started() -> bool:
            return (await q.get(first)).state == "running"

        await eventually(started, timeout=15)
        second = await q.enqueue("t", group="g")
        assert "global_cap" not in (await look.explain(second)).codes
        await look.set_policy(concurrency=1)
        e = await look.explain(second)
        got = [r for r in e.reasons if r.code == "global_cap"]
        assert got and got[0].data == {"cap": 1, "running": 1}
        await look.set_policy(concurrency=None)
        await look.set_group("*", cap=1)  # the default row caps g, which has no row
        e = await look.explain(second)
        got = [r for r in e.reasons if r.code == "group_cap"]
        assert got and got[0].data == {"group": "g", "cap": 1, "running": 1}
        assert 'the cap of the "*" row' in got[0].detail
        # status flags it too, from the stored "*" row (no process has the setting)
        assert await groups_at_cap(look) == [GroupAtCap("g", 1, 1, 1)]
        await look.set_group("g", cap=3)  # its own row wins over "*"
        assert "group_cap" not in (await look.explain(second)).codes
        await look.set_group("g", cap=1)
        e = await look.explain(second)
        assert next(r.detail for r in e.reasons if r.code == "group_cap").startswith(
            "Group 'g' is at its cap")
        # a stored rate the first claim used up: the queue's, then the group's
        await look.set_group("g", cap=None)
        await look.set_group("*", cap=None)
        await look.set_policy(rate=RateLimit(1, per=600.0))
        async with look.engine.begin() as conn:
            await RateLimit(1, 600.0, name="default").consume(conn, look._t, 1)
        e = await look.explain(second)
        assert [r.data["n"] for r in e.reasons if r.code == "rate_limit"] == [1]
        gate.set()

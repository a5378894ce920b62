"""The one-statement finalize never misses an edge added while its job finishes.

A plain success (no result, no parent, no dependents when leased) is finalized by one fenced
UPDATE (in autocommit on PostgreSQL). An edge to that job committed while the UPDATE waits
for the job's row lock must still release the new dependent: adding the edge sets the
job's ``has_dependents`` flag under that lock, so the UPDATE, re-checking its WHERE on the
new row version, leaves the job to the full finalize, which reads the edges afterwards."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from aiojobqueue import JobContext, JobQueue, JobState


async def test_edge_added_while_the_upstream_finalizes_is_released(
    make_queue: Callable[..., JobQueue],
) -> None:
    observer, q = make_queue(), make_queue()
    started, go = asyncio.Event(), asyncio.Event()
    order: list[str] = []

    @q.handler("x")
    async def x(ctx: JobContext) -> None:
        started.set()
        await go.wait()
        order.append("x")

    @q.handler("y")
    async def y(ctx: JobContext) -> None:
        order.append("y")

    async with observer, q:
        xid = await observer.enqueue("x", {})
        serving = asyncio.create_task(q.serve())
        try:
            await asyncio.wait_for(started.wait(), 15)
            async with observer.engine.begin() as conn:
                # The edge is written and x's row locked (flagged) in this open transaction ...
                async with observer.batch(connection=conn) as b:
                    yref = b.add("y", {}, depends_on=[xid])
                go.set()  # ... while x finishes: its finalize must wait for this lock
                await asyncio.sleep(0.5)
            assert (await observer.get(yref.id)).state != JobState.CANCELLED
            assert await observer.wait(yref.id, timeout=15) is None
        finally:
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
        assert order == ["x", "y"]
        assert (await observer.get(xid)).state == JobState.DONE

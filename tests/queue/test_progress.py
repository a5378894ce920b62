"""``ctx.progress()`` and ``Job.progress`` on every database: coalesced, visible while the job
runs, the last value landing before the finalize, fenced, and bad values refused."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from conftest import eventually
from sqlalchemy import event, update

from aiojobqueue import InvalidJobError, JobContext, JobQueue, LeaseLostError


@contextmanager
def progress_writes(q: JobQueue) -> Iterator[list[str]]:
    """The UPDATE statements that write the progress column, as the driver sees them."""
    seen: list[str] = []

    def spy(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        s = statement.lower()
        if s.lstrip().startswith("update") and "progress" in s:
            seen.append(statement)

    target = q.engine.sync_engine
    event.listen(target, "before_cursor_execute", spy)
    try:
        yield seen
    finally:
        event.remove(target, "before_cursor_execute", spy)


async def test_ten_thousand_reports_cost_a_handful_of_writes(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue()
    mid: list[Any] = []
    started = asyncio.Event()

    @q.handler("long")
    async def long(ctx: JobContext, n: int) -> str:
        t0 = time.monotonic()
        for i in range(n):
            await ctx.progress(i + 1, n, f"item {i + 1}")
            if i % 100 == 99:
                started.set()
                await asyncio.sleep(0.02)  # ~2 s in all: about two intervals of writes
        mid.append(time.monotonic() - t0)
        return "ok"

    async with q:
        with progress_writes(q) as writes:
            jid = await q.enqueue("long", {"n": 10_000})
            runner = asyncio.create_task(q.run_until_idle())
            await asyncio.wait_for(started.wait(), 30)

            async def seen_running() -> bool:
                job = await q.get(jid)
                return job.state == "running" and job.progress is not None

            await eventually(seen_running, timeout=10)  # visible while it runs
            during = (await q.get(jid)).progress
            await runner
        job = await q.get(jid)
    assert job.state == "done"
    assert during is not None and 0 < during["done"] <= 10_000 and during["total"] == 10_000
    # the last report landed (before the finalize: the finalize clears the lease, and a
    # fenced write after it would have changed nothing)
    assert job.progress is not None
    assert {k: job.progress[k] for k in ("done", "total", "message")} == {
        "done": 10_000, "total": 10_000, "message": "item 10000"}
    assert isinstance(job.progress["at"], datetime) and job.progress["at"].tzinfo == UTC
    # one write at once, then at most one per second, plus the held last one
    assert 2 <= len(writes) <= 2 + int(mid[0]) + 1, (len(writes), mid)


async def test_a_lone_report_lands_at_once_and_progress_is_kept(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue()

    @q.handler("one")
    async def one(ctx: JobContext) -> None:
        await ctx.progress(3)
        await ctx.progress(4, message="held")  # within the interval: held, then landed

    async with q:
        quiet = await q.enqueue("one")
        assert (await q.get(quiet)).progress is None
        with progress_writes(q) as writes:
            await q.run_until_idle()
        p = (await q.get(quiet)).progress
    assert p is not None and (p["done"], p["total"], p["message"]) == (4, None, "held")
    assert len(writes) == 2


async def test_jobs_that_never_report_write_no_progress(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue()

    @q.handler("plain")
    async def plain(ctx: JobContext) -> int:
        return 1

    async with q:
        ids = [await q.enqueue("plain") for _ in range(5)]
        with progress_writes(q) as writes:
            await q.run_until_idle()
        assert writes == []
        assert [(await q.get(i)).progress for i in ids] == [None] * 5


async def test_progress_is_fenced_like_checkpoint(
    make_queue: Callable[..., JobQueue], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An attempt whose lease went to another worker writes no progress: its report raises
    LeaseLostError and the stored value stays what the holder wrote."""
    from aiojobqueue import progress

    monkeypatch.setattr(progress, "INTERVAL", 0.05)  # no coalescing between the two reports
    q = make_queue(lease_ttl=30.0, heartbeat_interval=10.0)  # no beat notices the loss first
    outcome: list[str] = []
    stolen = asyncio.Event()
    go_on = asyncio.Event()

    @q.handler("fenced", max_attempts=1)
    async def fenced(ctx: JobContext) -> None:
        await ctx.progress(1, 10, "mine")
        stolen.set()
        await go_on.wait()
        await asyncio.sleep(0.1)
        try:
            await ctx.progress(2, 10, "stale")
        except LeaseLostError:
            outcome.append("lost")
            raise

    async with q:
        J = q._t.jobs
        jid = await q.enqueue("fenced")
        runner = asyncio.create_task(q.run_until_idle())
        await asyncio.wait_for(stolen.wait(), 30)
        # what a reclaim by another worker leaves: the row leased to someone else
        async with q.engine.begin() as conn:
            await conn.execute(update(J).where(J.c.id == jid)
                               .values(lease_owner="another-worker", attempts=J.c.attempts + 1))
        go_on.set()
        await eventually(lambda: outcome == ["lost"], timeout=10)
        p = (await q.get(jid)).progress
        assert p is not None and p["message"] == "mine"
        async with q.engine.begin() as conn:  # let the run end
            await conn.execute(update(J).where(J.c.id == jid).values(state="done",
                                                                      lease_owner=None))
        await asyncio.wait_for(runner, 30)


BAD = [("1",), (True,), (-1,), (float("nan"),), (1, float("inf")), (1, -2), (1, None, 5)]


async def test_bad_progress_is_refused_and_changes_nothing(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue()
    errors: list[BaseException] = []

    @q.handler("bad")
    async def bad(ctx: JobContext) -> None:
        for args in BAD:
            try:
                await ctx.progress(*args)
            except InvalidJobError as exc:
                errors.append(exc)

    async with q:
        jid = await q.enqueue("bad")
        await q.run_until_idle()
        job = await q.get(jid)
    assert len(errors) == len(BAD) and all(isinstance(e, ValueError) for e in errors)
    assert job.state == "done" and job.progress is None

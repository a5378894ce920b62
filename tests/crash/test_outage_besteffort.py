"""Best-effort writes never fail a job (issue 33, item 1).

Four 4-second jobs run; two of them call ``ctx.progress()`` every 0.2 s. While all four run,
the database goes away for 6 s (12 s on PostgreSQL too): every job must end ``done`` after
the outage, each with one run (none re-run), and the outage is logged, rate-limited.

The outage: PostgreSQL and MariaDB sit behind tests/tcpproxy.py, which cuts and refuses this
queue's connections. SQLite has no network: a second connection holds the file's write lock
(``BEGIN EXCLUSIVE``) for the same time, so every write of the queue (progress, heartbeats,
finalize) waits on it (busy timeout) until it lets go; reads still work (WAL). That proves
the same thing for SQLite's real outage mode (a writer that hogs the file), not a dead
server; on SQLite this case already passed before the fix (a write waits, it does not fail),
on PostgreSQL and MariaDB the reporting jobs failed and ran again.

Tracing is not in this test: it writes nothing to the database of its own (the trace
context rides on the claim and the finalize), and a global tracer provider would leak
into the other tests of this process (tests/queue/test_tracing.py runs it in a subprocess).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy.engine import make_url
from tcpproxy import TcpProxy

from aiojobqueue import JobContext, JobFailed, JobQueue, JobState, metrics

CASES = [("sqlite", 6.0), ("postgresql", 6.0), ("mariadb", 6.0), ("postgresql", 12.0)]


class _Locker:
    """SQLite's outage: another connection holds the write lock for ``seconds``."""

    def __init__(self, path: str) -> None:
        self.path = path

    async def outage(self, seconds: float) -> None:
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            conn.execute("BEGIN EXCLUSIVE")
            await asyncio.sleep(seconds)
            conn.execute("ROLLBACK")
        finally:
            conn.close()


@contextlib.asynccontextmanager
async def _outage_kit(db_url: str) -> AsyncIterator[tuple[str, Any]]:
    """(the URL the queue under test uses, an object with ``await .outage(seconds)``)."""
    if db_url.startswith("sqlite"):
        yield db_url, _Locker(str(make_url(db_url).database))
        return
    async with TcpProxy.for_url(db_url) as px:
        yield px.url(db_url), px


@pytest.mark.slow
@pytest.mark.parametrize(("db", "seconds"), CASES, indirect=["db"],
                         ids=[f"{d}-{int(s)}s" for d, s in CASES])
async def test_progress_during_outage_never_fails_a_job(
    make_queue: Callable[..., JobQueue], db_url: str, prefix: str, seconds: float,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "aiojobqueue")
    async with make_queue() as observer, _outage_kit(db_url) as (url, kit):
        # a user's settings (default lease and heartbeat), a fast poll for the test's pace
        q = JobQueue(url, prefix=prefix, poll_interval=0.05, capacity=4)
        runs: Counter[int] = Counter()
        started: set[int] = set()
        took: dict[int, float] = {}
        # the other best-effort paths a job triggers: hooks and the Prometheus metrics
        # (their wait histogram reads the database; the gauges are read during the outage)
        events: list[tuple[str, int]] = []
        q.on("start", lambda ev: events.append((ev.event, ev.job_id)))
        q.on("done", lambda ev: events.append((ev.event, ev.job_id)))
        registry = CollectorRegistry()
        metrics.register(q, registry, cache_seconds=0.0, timeout=1.0)

        @q.handler("work")
        async def work(ctx: JobContext, report: bool) -> str:
            runs[ctx.job_id] += 1
            started.add(ctx.job_id)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 4.0:
                if report:
                    await ctx.progress(time.monotonic() - t0, 4.0, "working")
                await asyncio.sleep(0.2)
            took[ctx.job_id] = time.monotonic() - t0
            return "ok"

        ids = [await observer.enqueue("work", {"report": i < 2}, max_attempts=3)
               for i in range(4)]
        async with q:
            serving = asyncio.create_task(q.serve())
            try:
                deadline = time.monotonic() + 20
                while len(started) < 4:
                    assert time.monotonic() < deadline, "the four jobs never all started"
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.5)  # every job is inside its loop, reporting
                outage = asyncio.create_task(kit.outage(seconds))
                await asyncio.sleep(1.0)
                # a scrape during the outage serves the last counts and fails nothing
                workers = await asyncio.to_thread(
                    registry.get_sample_value, "aiojobqueue_workers")
                await outage
                for i in ids:
                    with contextlib.suppress(JobFailed):
                        await observer.wait(i, timeout=60)
                jobs = [await observer.get(i) for i in ids]
            finally:
                serving.cancel()
                await asyncio.gather(serving, return_exceptions=True)
    assert [j.state for j in jobs] == [JobState.DONE] * 4, [j.error for j in jobs]
    assert [j.result for j in jobs] == ["ok"] * 4
    assert dict(runs) == {i: 1 for i in ids}, "a job ran again"
    assert all(j.attempts == 1 for j in jobs)
    # progress never held a handler up for the outage (4 s of work, 0.2 s steps)
    assert max(took.values()) < 5.5, took
    assert sorted(events) == sorted([("start", i) for i in ids] + [("done", i) for i in ids])
    assert registry.get_sample_value(
        "aiojobqueue_jobs_finished_total", {"type": "work", "group": "default",
                                            "outcome": "done"}) == 4
    assert workers is None or workers >= 0
    if db_url.startswith("sqlite"):
        return  # a locked file makes a write wait (busy timeout), not fail: nothing to log
    warned = [r for r in caplog.records if "progress" in r.getMessage()]
    assert warned, "the failed progress writes were not logged"
    # rate-limited: two jobs reporting 5 times a second for the whole outage
    assert len(warned) <= 2 * (seconds / 5 + 2), [r.getMessage() for r in warned]

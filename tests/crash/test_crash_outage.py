"""Database outages: serve() logs, backs off, reconnects and finishes every job, whether
the link drops for a moment or for longer than lease_ttl (running jobs are then stopped
before their leases can expire and released, never run twice at once). The outage is a TCP
proxy refusing and cutting this test's connections; the servers themselves stay up."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from tcpproxy import TcpProxy

from aiojobqueue import JobContext, JobQueue, JobState

SERVERS = pytest.mark.parametrize("db", ["postgresql", "mariadb"], indirect=True)


@SERVERS
async def test_serve_rides_out_outages(
    make_queue: Callable[..., JobQueue], db_url: str, prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "aiojobqueue")
    async with make_queue() as observer, TcpProxy.for_url(db_url) as px:
        q = JobQueue(px.url(db_url), prefix=prefix, poll_interval=0.05, lease_ttl=2.0,
                     heartbeat_interval=0.4, retry_backoff=0.01, retry_backoff_max=0.05,
                     shutdown_timeout=1.0, capacity=4)
        runs: dict[int, list[tuple[float, float, int]]] = defaultdict(list)
        live: set[int] = set()
        long_live: set[int] = set()
        overlaps: list[int] = []

        @q.handler("step")
        async def step(ctx: JobContext, n: int, seconds: float) -> dict[str, Any]:
            if ctx.job_id in live:
                overlaps.append(ctx.job_id)
            live.add(ctx.job_id)
            if seconds > 1:
                long_live.add(ctx.job_id)
            t0 = time.monotonic()
            try:
                await asyncio.sleep(seconds)
            finally:
                live.discard(ctx.job_id)
                long_live.discard(ctx.job_id)
                runs[ctx.job_id].append((t0, time.monotonic(), ctx.attempt))
            return {"n": n, "attempt": ctx.attempt}

        # 4 independent chains of 15: always something running when the link drops
        refs = []
        async with observer.batch() as b:
            for c in range(4):
                prev = None
                for i in range(15):
                    # one job per chain outlasts the lease: the long outage finds it running
                    secs = 3.0 if i == 7 else 0.1
                    prev = b.add("step", {"n": c * 100 + i, "seconds": secs}, max_attempts=10,
                                 depends_on=[prev] if prev is not None else [])
                    refs.append(prev)
        assert len({r.id for r in refs}) == 60

        async with q:
            serving = asyncio.create_task(q.serve())
            try:
                await _until(lambda: _done_count(observer), 8, 30)
                await px.outage(0.8)  # shorter than the lease
                await _until(lambda: _done_count(observer), 22, 30)
                await _until(lambda: _one(len(long_live)), 1, 30)
                await px.outage(3.5)  # longer than the lease (2 s), with a long job running
                await _until(lambda: _done_count(observer), 60, 60)
            finally:
                serving.cancel()
                await asyncio.gather(serving, return_exceptions=True)
        jobs = await _all_jobs(observer)
        assert all(j.state == JobState.DONE for j in jobs)
        for j in jobs:
            assert j.result["attempt"] == j.attempts  # the result is the last attempt's
        assert not overlaps  # no job ran twice at once in this worker
        reruns = sum(len(r) - 1 for r in runs.values())
        text = caplog.text
        assert "heartbeat failed" in text or "claim failed" in text
        assert "lease unrenewed" in text  # the long outage stopped the running jobs
        print(f"60 jobs done through 2 outages; {reruns} re-run(s), "
              f"{sum(1 for e in caplog.records if 'failed' in e.getMessage())} warnings")


async def _all_jobs(q: JobQueue) -> list[Any]:
    from sqlalchemy import select

    J = q._t.jobs

    async def read(conn: Any) -> list[int]:
        return [r[0] for r in await conn.execute(select(J.c.id).order_by(J.c.id))]

    return [await q.get(i) for i in await q._read(read)]


async def _one(n: int) -> int:
    return n


async def _done_count(q: JobQueue) -> int:
    return sum(1 for j in await _all_jobs(q) if j.state == JobState.DONE)


async def _until(count: Callable[[], Any], n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while await count() < n:
        assert time.monotonic() < deadline, f"fewer than {n} jobs done after {timeout}s"
        await asyncio.sleep(0.05)

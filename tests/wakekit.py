"""Timing a notification wake-up: the PgBouncer and psycopg tests ask whether an idle
worker is woken by another queue's enqueue, which only a notification can do in time."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiojobqueue import JobContext, JobQueue

#: short intervals, so that leases, heartbeats and shutdowns of a test take seconds
QUICK: dict[str, Any] = {"poll_interval": 0.05, "lease_ttl": 3.0, "heartbeat_interval": 0.5,
                         "shutdown_timeout": 2.0}


async def wake_time(url: str, prefix: str, **kw: Any) -> float:
    """Seconds from another queue's enqueue to the job's start on an idle worker whose poll
    is 30 s (``kw``: more options of the worker); inf when it did not start within 8 s."""
    worker = JobQueue(url, prefix=prefix, **{**QUICK, "poll_interval": 30.0, **kw})
    started = asyncio.Event()

    @worker.handler("ping")
    async def ping(ctx: JobContext) -> None:
        started.set()

    producer = JobQueue(url, prefix=prefix, **QUICK)
    async with worker, producer:
        task = asyncio.create_task(worker.serve())
        try:
            await asyncio.sleep(6.5)  # past the listener's probe (PROBE_WAIT) and first scan
            t0 = time.monotonic()
            await producer.enqueue("ping")
            try:
                async with asyncio.timeout(8.0):
                    await started.wait()
            except TimeoutError:
                return float("inf")
            return time.monotonic() - t0
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

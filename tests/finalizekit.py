"""Queues that serve in the background and record their finalize events, for the
finalize tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from aiojobqueue import JobQueue


def serving_queue(url: str, prefix: str, **kw: Any) -> JobQueue:
    """A queue with short leases, heartbeats and backoffs, for tests that serve it."""
    opts: dict[str, Any] = {"prefix": prefix, "poll_interval": 0.05, "lease_ttl": 3.0,
                            "heartbeat_interval": 0.5, "retry_backoff": 0.01,
                            "retry_backoff_max": 0.05, "shutdown_timeout": 1.0}
    return JobQueue(url, **{**opts, **kw})


def watched_queue(url: str, prefix: str) -> tuple[JobQueue, list[str]]:
    """A serving queue and the list of its ``done`` / ``discarded`` events, in order."""
    q = serving_queue(url, prefix)
    events: list[str] = []
    q.on("done", lambda e: events.append("done"))
    q.on("discarded", lambda e: events.append("discarded"))
    return q, events


@contextlib.asynccontextmanager
async def serving(q: JobQueue) -> AsyncIterator[None]:
    """``q.serve()`` in the background for the block's duration."""
    task = asyncio.create_task(q.serve())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

"""The queue shared by every worker process of the multi-worker example.

Each worker process imports this module and serves ``queue``:

    aiojobqueue worker jobs:queue          # run from this directory

The database comes from AIOJOBQUEUE_URL, so every process (and every machine) points at the
same PostgreSQL or MySQL/MariaDB. See README.md beside this file.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

from aiojobqueue import JobContext, JobQueue

queue = JobQueue(
    os.environ.get("AIOJOBQUEUE_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/test"),
    prefix=os.environ.get("AIOJOBQUEUE_PREFIX", "ajq_"),
    concurrency=int(os.environ.get("AIOJOBQUEUE_CONCURRENCY", "6")),  # across ALL workers
    capacity=int(os.environ.get("AIOJOBQUEUE_CAPACITY", "4")),  # per worker process
    group_limits={"video": 2},  # at most 2 video jobs at once, fleet-wide
    poll_interval=float(os.environ.get("AIOJOBQUEUE_POLL", "0.5")),
    heartbeat_interval=2.0,
    lease_ttl=10.0,
)


@queue.handler("render", timeout=120, max_attempts=3)
async def render(ctx: JobContext, n: int, seconds: float = 0.5) -> dict[str, Any]:
    await asyncio.sleep(seconds)  # stand-in for real work
    return {"n": n, "worker": ctx.queue.worker_id, "pid": os.getpid(),
            "host": socket.gethostname(), "attempt": ctx.attempt}

"""A worker process for the multi-process tests (run with ``sys.executable``).

    python tests/dagworker.py MODE URL PREFIX LOG GO

Waits until the file GO exists (so every process starts at the same moment), then:

* ``dag``: runs jobs of type ``work`` until the queue is idle; each attempt appends
  ``S <job> <attempt> <time> <pid>`` when it starts and ``E ...`` when it ends to LOG.
* ``claim``: calls the claim transaction directly in small random batches until nothing is
  left, appending ``C <job> <attempt> <worker_id>`` per claimed job (nothing is finished).
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import time
from typing import Any

from aiojobqueue import JobContext, JobQueue


async def wait_for_go(path: str) -> None:
    deadline = time.monotonic() + 60
    while not os.path.exists(path):  # noqa: ASYNC240 - a cheap poll, before any work
        if time.monotonic() > deadline:
            raise SystemExit("no go signal")
        await asyncio.sleep(0.01)


async def run_dag(q: JobQueue, log: Any, go: str) -> None:
    pid = os.getpid()

    @q.handler("work")
    async def work(ctx: JobContext, n: int) -> int:
        log.write(f"S {ctx.job_id} {ctx.attempt} {time.time():.6f} {pid}\n")
        log.flush()
        await asyncio.sleep(random.random() * 0.004)
        log.write(f"E {ctx.job_id} {ctx.attempt} {time.time():.6f} {pid}\n")
        log.flush()
        return n

    async with q:
        await wait_for_go(go)
        await q.run_until_idle()


async def run_claims(q: JobQueue, log: Any, go: str) -> None:
    async with q:
        await wait_for_go(go)
        empty = 0
        while empty < 3:
            want = random.randint(1, 5)
            got = await q._write(lambda conn: q._core.claimer.claim(conn, want, ["t"]))  # noqa: B023
            for c in got:
                log.write(f"C {c.id} {c.attempt} {q.worker_id}\n")
            log.flush()
            empty = 0 if got else empty + 1
            await asyncio.sleep(random.random() * 0.005)


def main() -> None:
    mode, url, prefix, log_path, go = sys.argv[1:6]
    q = JobQueue(url, prefix=prefix, capacity=4, poll_interval=0.05, lease_ttl=20.0,
                 heartbeat_interval=2.0, retry_backoff=0.01, retry_backoff_max=0.05)
    with open(log_path, "a", buffering=1) as log:
        asyncio.run((run_dag if mode == "dag" else run_claims)(q, log, go))


if __name__ == "__main__":
    main()

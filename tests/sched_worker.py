"""A worker process for the multi-process scheduling tests (not a test module).

    python tests/sched_worker.py URL PREFIX LOGFILE [--concurrency N] [--capacity N]
        [--group-limits JSON] [--rate N,PER] [--every SECONDS] [--lease-ttl S]

Serves jobs of type ``work`` (sleeps ``args["ms"]``) until SIGTERM. Every attempt appends
one JSON line ``{"id", "group", "pid", "start", "end"}`` (wall-clock seconds, the same clock
for every process on the box) to LOGFILE; each line is one small O_APPEND write, so lines of
several processes never interleave. With ``--every``, registers a periodic schedule ``tick``
that enqueues ``work`` jobs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from datetime import timedelta
from typing import Any

from aiojobqueue import JobContext, JobQueue, RateLimit
from aiojobqueue.runner import run_worker


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("prefix")
    p.add_argument("log")
    p.add_argument("--concurrency", type=int, default=None)
    p.add_argument("--capacity", type=int, default=10)
    p.add_argument("--group-limits", default="{}")
    p.add_argument("--rate", default=None)
    p.add_argument("--every", type=float, default=None)
    p.add_argument("--lease-ttl", type=float, default=3.0)
    # one line {"pid", "seen", "concurrency"} per change of the stored policy this worker
    # applies (wall clock: when the claims of this process start to follow it)
    p.add_argument("--policy-log", default=None)
    a = p.parse_args()
    if a.policy_log:
        _log_policy_changes(a.policy_log)
    limits = []
    if a.rate:
        n, per = a.rate.split(",")
        limits.append(RateLimit(int(n), per=float(per)))
    q = JobQueue(
        a.url, prefix=a.prefix, concurrency=a.concurrency, capacity=a.capacity,
        group_limits=json.loads(a.group_limits), limits=limits, poll_interval=0.05,
        lease_ttl=a.lease_ttl, heartbeat_interval=a.lease_ttl / 4, shutdown_timeout=5.0,
        retry_backoff=0.01, retry_backoff_max=0.05,
    )
    fd = os.open(a.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    @q.handler("work")
    async def work(ctx: JobContext, ms: int = 0, **_: Any) -> dict[str, Any]:
        start = time.time()
        await asyncio.sleep(ms / 1000)
        end = time.time()
        line = json.dumps({"id": ctx.job_id, "group": ctx.group, "pid": os.getpid(),
                           "start": start, "end": end})
        os.write(fd, (line + "\n").encode())
        return {"ok": True}

    if a.every:
        q.periodic("tick", every=timedelta(seconds=a.every), type="work", args={"ms": 1})

    async def run() -> None:
        async with q:
            print("ready", flush=True)
            await run_worker(q)

    asyncio.run(run())
    os.close(fd)
    sys.exit(0)


def _log_policy_changes(path: str) -> None:
    pfd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            policy = getattr(record, "policy", None)
            if policy is not None:
                line = json.dumps({"pid": os.getpid(), "seen": time.time(),
                                   "concurrency": policy.concurrency})
                os.write(pfd, (line + "\n").encode())

    lg = logging.getLogger("aiojobqueue.policy")
    lg.addHandler(Seen())
    lg.setLevel(logging.INFO)


if __name__ == "__main__":
    main()

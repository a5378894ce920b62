"""A worker process with a settable schedule clock (not a test module).

    python tests/clock_worker.py URL PREFIX LOGFILE START_ISO T0_FILE SPEED CRON TZ

Registers the schedule ``paris`` (``CRON`` in ``TZ``) enqueueing ``work`` jobs, and reads
the schedules' time from a clock that all processes of a test agree on: ``START_ISO`` at
the wall-clock epoch second written in ``T0_FILE``, then running ``SPEED`` times faster
than real time; it stands at ``START_ISO`` until the test writes that file (once every
worker is up, however loaded the machine). So a test crosses a daylight-saving change in
seconds. Every run of a ``work`` job appends ``{"id", "pid"}`` to LOGFILE (one O_APPEND
write). Serves until SIGTERM.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from datetime import datetime, timedelta
from typing import Any

from aiojobqueue import JobContext, JobQueue
from aiojobqueue.runner import run_worker


def main() -> None:
    url, prefix, log, start_iso, t0_file, speed, cron, tz = sys.argv[1:9]
    start, k = datetime.fromisoformat(start_iso), float(speed)
    t0: list[float] = []
    q = JobQueue(url, prefix=prefix, poll_interval=0.05, lease_ttl=3.0,
                 heartbeat_interval=0.75, shutdown_timeout=5.0)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    @q.handler("work")
    async def work(ctx: JobContext, **_: Any) -> None:
        os.write(fd, (json.dumps({"id": ctx.job_id, "pid": os.getpid()}) + "\n").encode())

    async def clock() -> datetime:
        if not t0:
            t0.extend(_read_t0(t0_file))
        if not t0:
            return start
        return start + timedelta(seconds=max(time.time() - t0[0], 0.0) * k)

    q.periodic("paris", type="work", cron=cron, tz=tz)
    q.schedule_clock(clock)

    async def run() -> None:
        async with q:
            print("ready", flush=True)
            await run_worker(q)

    asyncio.run(run())
    os.close(fd)


def _read_t0(path: str) -> list[float]:
    """The clock's start (epoch seconds) once the test wrote it (a tiny local file)."""
    try:
        with open(path) as f:
            return [float(f.read())]
    except FileNotFoundError:
        return []


if __name__ == "__main__":
    main()

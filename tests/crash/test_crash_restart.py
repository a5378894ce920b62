"""Really restart PostgreSQL and MariaDB while workers serve (not a proxy this time).

Gated: it stops shared servers, so it only runs with AIOJOBQUEUE_RESTART_TESTS=1 (CI runs it
as a separate final step, alone). Evidence: the timeline it prints (restart, back, first
finalize after) and every job done exactly once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from conftest import MY_URL, PG_URL, drop_tables
from sqlalchemy import func, select

from aiojobqueue import JobContext, JobQueue, JobState

pytestmark = [
    pytest.mark.slow,
    pytest.mark.restart,
    pytest.mark.timeout(300),
    pytest.mark.skipif(os.environ.get("AIOJOBQUEUE_RESTART_TESTS") != "1",
                       reason="restarts the shared servers: set AIOJOBQUEUE_RESTART_TESTS=1"),
]

PG_RESTART = ["pg_ctlcluster", "--skip-systemctl-redirect", "15", "main", "restart"]
PG_START = ["pg_ctlcluster", "--skip-systemctl-redirect", "15", "main", "start"]
PG_READY = ["pg_isready", "-h", "127.0.0.1", "-p", "5432", "-q"]
MY_STOP = ["mysqladmin", "-uroot", "shutdown"]
MY_START = ["start-stop-daemon", "--start", "--oknodo", "--background",
            "--exec", "/usr/sbin/mariadbd", "--", "--user=mysql"]
MY_READY = ["mysqladmin", "-uroot", "-h127.0.0.1", "ping"]


async def _run(cmd: list[str]) -> int:
    p = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.DEVNULL,
                                             stderr=asyncio.subprocess.DEVNULL)
    return await p.wait()


async def _until_ready(cmd: list[str], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while await _run(cmd) != 0:
        assert time.monotonic() < deadline, f"{cmd} not ready after {timeout}s"
        await asyncio.sleep(0.5)


class Run:
    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.prefix = f"rs{uuid.uuid4().hex[:8]}_"
        self.q = JobQueue(url, prefix=self.prefix, poll_interval=0.1, lease_ttl=4.0,
                          heartbeat_interval=0.5, retry_backoff=0.05, retry_backoff_max=0.5,
                          shutdown_timeout=1.0, capacity=4)
        self.url = url
        self.calls: Counter[int] = Counter()
        self.fin: list[tuple[float, int]] = []
        self.ids: list[int] = []

        @self.q.handler("step")
        async def step(ctx: JobContext, i: int) -> dict[str, int]:
            self.calls[ctx.job_id] += 1
            await asyncio.sleep(0.1)
            return {"i": i, "attempt": ctx.attempt}

        self.q.on("done", lambda e: self.fin.append((time.time(), e.job_id)))

    async def done(self) -> int:
        J = self.q._t.jobs

        async def count(conn: Any) -> int:
            return int((await conn.execute(select(func.count()).select_from(J).where(
                J.c.id.in_(self.ids), J.c.state == JobState.DONE.value))).scalar_one())

        try:
            return await self.q._read(count)
        except Exception:  # the server is down right now
            return -1


async def test_restart_postgresql_and_mariadb_mid_run(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "aiojobqueue")
    runs = [Run("postgresql", PG_URL), Run("mariadb", MY_URL)]
    timeline: list[tuple[float, str]] = []
    tasks: list[asyncio.Task[None]] = []
    try:
        for r in runs:
            await r.q.start()
            async with r.q.batch() as b:  # 3 chains of 40: something always runs
                refs = []
                for c in range(3):
                    prev = None
                    for i in range(40):
                        prev = b.add("step", {"i": c * 100 + i}, max_attempts=10,
                                     depends_on=[prev] if prev is not None else [])
                        refs.append(prev)
            r.ids = [x.id for x in refs]
            tasks.append(asyncio.create_task(r.q.serve()))
        pg, my = runs
        while await pg.done() < 15 or await my.done() < 15:  # noqa: ASYNC110 - polls the DB
            await asyncio.sleep(0.1)

        timeline.append((time.time(), "postgresql restart begins"))
        assert await _run(PG_RESTART) == 0
        await _until_ready(PG_READY)
        timeline.append((time.time(), "postgresql is back"))

        timeline.append((time.time(), "mariadb shutdown begins"))
        await _run(MY_STOP)
        timeline.append((time.time(), "mariadb is down"))
        await asyncio.sleep(1.0)
        assert await _run(MY_START) == 0
        await _until_ready(MY_READY)
        timeline.append((time.time(), "mariadb is back"))

        deadline = time.monotonic() + 120
        for r in runs:
            while await r.done() != len(r.ids):
                assert time.monotonic() < deadline, f"{r.name}: {await r.done()} done"
                await asyncio.sleep(0.2)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # leave the servers up whatever happened
        if await _run(PG_READY) != 0:
            await _run(PG_START)
        if await _run(MY_READY) != 0:
            await _run(MY_START)
        await _until_ready(PG_READY)
        await _until_ready(MY_READY)
        for r in runs:
            await r.q.close()
    for r in runs:
        async with r.q:
            for i in r.ids:
                job = await r.q.get(i)
                assert job.state == JobState.DONE and job.result["attempt"] == job.attempts
            await r.q.close()
        assert Counter(i for _, i in r.fin) == Counter(r.ids)  # one reported finalize each
        await drop_tables(r.url, r.prefix)
    marks = dict((what, t) for t, what in timeline)
    for r, back in ((runs[0], "postgresql is back"), (runs[1], "mariadb is back")):
        after = [t for t, _ in r.fin if t > marks[back]]
        first = min(after) - marks[back] if after else float("nan")
        reruns = sum(r.calls.values()) - len(r.ids)
        print(f"RESTART {r.name}: {len(r.ids)} jobs done, {reruns} re-run(s), first finalize "
              f"{first:.2f}s after the server was back")
    t0 = timeline[0][0]
    for t, what in timeline:
        print(f"  +{t - t0:6.2f}s {what}")
    warnings = [rec.getMessage() for rec in caplog.records]
    assert any("failed" in w or "database error" in w for w in warnings)

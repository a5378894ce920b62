"""Does the retention sweep slow the claim? Claim latency with the sweep running and without,
in the same run.

    .venv/bin/python bench/retention.py [sqlite|postgresql|mariadb ...] [--old 200000]
        [--rate 200] [--phase 15] [--rounds 3]

Fills the jobs table with ``--old`` done jobs finished a day ago (one INSERT ... SELECT;
every tenth also a dependent of the one before it, so components are walked), starts one
worker process (``serve()``, capacity 16) and offers ``--rate`` jobs a second (2 ms each).
Then alternates ``--rounds`` times: ``--phase`` seconds without a sweep, ``--phase``
seconds with the worker sweeping in its own event loop, beside its claims, as a serving
worker's Sweeper does (its lease, sweep.sweep with retention.BATCH and PAUSE and the sweep's
own ROWS and REST, back to back while the phase lasts; the worker's periodic Sweeper is
off). The worker times each ``Claimer.claim`` call with its wall clock; the claims are split
by phase. One row per database: claim p50/p99 without and with
the sweep, their ratio (the bar: p99 with <= 1.2x without), and what the sweep deleted.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from soak import URLS, pct  # noqa: E402
from tags import _rows_sql  # noqa: E402


async def worker_main(url: str, prefix: str, out: str, flag: str) -> None:
    from aiojobqueue import JobContext, JobQueue, retention
    from aiojobqueue.claim import Claimer
    from aiojobqueue.runner import run_worker

    took: list[tuple[float, float]] = []
    real = Claimer.claim

    async def timed(self: Claimer, *a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return await real(self, *a, **kw)
        finally:
            took.append((time.time(), time.perf_counter() - t))

    Claimer.claim = timed  # type: ignore[method-assign]
    retention.EVERY = 1e9  # no sweep of its own: the phases decide (sweeping() below)
    q = JobQueue(url, prefix=prefix, capacity=16, poll_interval=0.5)

    @q.handler("work")
    async def work(ctx: JobContext) -> None:
        await asyncio.sleep(0.002)

    async def sweeping() -> None:
        """Sweep back to back while the coordinator's flag file exists: in this process,
        beside the claims, as a serving worker's Sweeper does."""
        from aiojobqueue.retention import Sweeper, read_retention
        from aiojobqueue.sweep import sweep

        db = q._started().db
        sw = Sweeper(db)
        while True:
            if not os.path.exists(flag):  # noqa: ASYNC240 - a bench's own flag
                await asyncio.sleep(0.05)
                continue
            policy = await read_retention(db)
            if policy and await db.write(sw.acquire):
                await sweep(db, policy, sw.renew, retention.BATCH, retention.PAUSE)

    async with q:
        print("ready", flush=True)
        task = asyncio.create_task(sweeping())
        try:
            await run_worker(q)
        finally:
            task.cancel()
            Path(out).write_text(json.dumps(took))  # noqa: ASYNC240 - at exit


async def fill(q: Any, old: int) -> None:
    from sqlalchemy import text

    J, D = q._t.jobs.name, q._t.deps.name
    async with q.engine.begin() as conn:
        name = conn.dialect.name
        await conn.execute(text(_rows_sql(name, J, old, "done")))
        ago = {"postgresql": "now() - interval '1 day'",
               "mysql": "UTC_TIMESTAMP(6) - INTERVAL 1 DAY"}.get(
            name, "((julianday('now') - 2440587.5) * 86400.0 - 86400)")
        await conn.execute(text(f"UPDATE {J} SET finished_at = {ago}"))
        await conn.execute(text(f"INSERT INTO {D} (job_id, depends_on_id) SELECT id, id - 1 "
                                f"FROM {J} WHERE id % 10 = 0"))


async def count(q: Any) -> int:
    """Old jobs left (the offered ones are type 'work')."""
    from sqlalchemy import func, select

    J = q._t.jobs
    return int(await q._read(lambda c: c.scalar(
        select(func.count()).select_from(J).where(J.c.type == "bench"))))


async def one(db: str, a: Any) -> tuple[Any, ...]:
    from aiojobqueue import JobQueue
    from aiojobqueue.retention import write_retention

    url = URLS.get(db) or f"sqlite+aiosqlite:///{tempfile.mkdtemp()}/bench.db"
    prefix = f"br{uuid.uuid4().hex[:6]}_"
    q = JobQueue(url, prefix=prefix)
    await q.start()
    out = Path(tempfile.mkdtemp()) / "claims.json"
    try:
        await fill(q, a.old)
        flag = out.parent / "sweep"
        proc = subprocess.Popen(  # noqa: ASYNC220 - started once
            [sys.executable, __file__, "--worker", url, prefix, str(out), str(flag)],
            stdout=subprocess.PIPE)
        assert proc.stdout is not None
        proc.stdout.readline()
        stop = asyncio.Event()

        async def produce() -> None:
            t0, k = time.monotonic(), 0
            while not stop.is_set():
                async with q.batch() as b:
                    for _ in range(a.rate // 10):
                        b.add("work")
                k += 1
                await asyncio.sleep(max(0.0, t0 + k / 10 - time.monotonic()))

        db_ = q._started().db
        policy = {"done": timedelta(hours=1)}
        await write_retention(db_, policy)
        producer = asyncio.create_task(produce())
        await asyncio.sleep(3)  # warm up
        phases: list[tuple[str, float, float]] = []
        deleted = 0
        for _ in range(a.rounds):
            t = time.time()
            await asyncio.sleep(a.phase)
            phases.append(("without", t, time.time()))
            t = time.time()
            before = await count(q)
            flag.touch()
            await asyncio.sleep(a.phase)
            flag.unlink()  # the worker stops after the batch in flight
            phases.append(("with", t, time.time()))
            await asyncio.sleep(0.5)
            deleted += before - await count(q)
        stop.set()
        await producer
        proc.terminate()
        proc.wait()
        took = json.loads(out.read_text())
        split: dict[str, list[float]] = {"without": [], "with": []}
        for kind, t0, t1 in phases:
            split[kind] += [d for t, d in took if t0 <= t < t1]
        w, s = split["without"], split["with"]
        return (db, len(w), pct(w, 0.5) * 1e3, pct(w, 0.99) * 1e3, len(s), pct(s, 0.5) * 1e3,
                pct(s, 0.99) * 1e3, pct(s, 0.99) / pct(w, 0.99), deleted)
    finally:
        async with q.engine.begin() as conn:
            await conn.run_sync(q._t.metadata.drop_all)
        await q.close()


async def main() -> None:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("dbs", nargs="*", default=["sqlite", "postgresql", "mariadb"])
    ap.add_argument("--old", type=int, default=200_000)
    ap.add_argument("--rate", type=int, default=200)
    ap.add_argument("--phase", type=float, default=15)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    rows = []
    for db in a.dbs:
        rows.append(await one(db, a))
        print(rows[-1], flush=True)
    print(f"\nload {os.getloadavg()[0]:.1f}")
    print(f"{'database':10} {'claims':>6} {'p50 ms':>7} {'p99 ms':>7} | {'claims':>6} "
          f"{'p50 ms':>7} {'p99 ms':>7} | {'p99 with/without':>16} {'deleted/s':>9}")
    print(f"{'':10} {'without the sweep':^22} | {'with the sweep running':^22} |")
    for r in rows:
        print(f"{r[0]:10} {r[1]:6d} {r[2]:7.2f} {r[3]:7.2f} | {r[4]:6d} {r[5]:7.2f} {r[6]:7.2f} "
              f"| {r[7]:16.2f} {r[8] / (a.phase * a.rounds):9.0f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        asyncio.run(worker_main(*sys.argv[2:6]))
    else:
        asyncio.run(main())

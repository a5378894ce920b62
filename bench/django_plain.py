"""Plain ``def`` handlers against async ones, and Django's ``Task.enqueue()`` against a
direct ``SyncQueue.enqueue``, in the same run (one table each).

1. Handlers: N jobs enqueued as one batch, then ``run_until_idle`` of one worker at
   capacity 10 and 50; jobs/s of a no-op handler and of one sleeping 1 ms
   (``time.sleep`` in a plain handler, ``asyncio.sleep`` in an async one), and the CPU
   each job costs the process (all threads: steadier than the rate on a loaded machine).
   Target: no-op plain >= 0.5x no-op async.
2. Enqueue: ``--single`` enqueues one at a time through the Django backend
   (``add.enqueue(1, 2)``: Django's Task, its validation, our TaskResult) and through the
   backend's own SyncQueue (the same job), alternating in ``--reps`` pairs; medians and the
   median of the pairs' ratios. Target: backend >= 0.8x SyncQueue.

    PYTHONPATH=$PWD .venv/bin/python bench/django_plain.py [--db sqlite|postgresql|mariadb]
        [--jobs 2000] [--hreps 3] [--reps 7] [--single 300]

Tables use the prefix ``djb_`` and are dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from sqlalchemy import create_engine

from aiojobqueue import JobQueue
from aiojobqueue.dialects.urls import sync_url
from aiojobqueue.schema import build_tables

PREFIX = "djb_"
TMP = tempfile.mkdtemp(prefix="ajq-djbench-")
URLS = {
    "sqlite": f"sqlite:///{TMP}/bench.db",
    "postgresql": "postgresql://postgres@127.0.0.1:5432/test",
    "mariadb": "mysql://root@127.0.0.1:3306/test",
}
DJANGO_DB = {
    "sqlite": {"ENGINE": "django.db.backends.sqlite3", "NAME": f"{TMP}/bench.db"},
    "postgresql": {"ENGINE": "django.db.backends.postgresql", "NAME": "test",
                   "USER": "postgres", "HOST": "127.0.0.1", "PORT": "5432"},
    "mariadb": {"ENGINE": "django.db.backends.mysql", "NAME": "test", "USER": "root",
                "HOST": "127.0.0.1", "PORT": "3306"},
}


def drop(url: str) -> None:
    engine = create_engine(sync_url(url))
    with engine.begin() as c:
        build_tables(PREFIX).metadata.drop_all(c)
    engine.dispose()


async def handler_rate(url: str, kind: str, capacity: int, n: int) -> tuple[float, float]:
    """(jobs/s, this process's CPU microseconds per job: every thread's) of one worker
    running ``n`` jobs of one handler kind."""
    q = JobQueue(url.replace("sqlite:", "sqlite+aiosqlite:", 1) if url.startswith("sqlite:")
                 else url, prefix=PREFIX, capacity=capacity, poll_interval=0.05)

    if kind == "plain no-op":
        @q.handler("h")
        def plain_noop(ctx: Any) -> None:
            return None
    elif kind == "async no-op":
        @q.handler("h")
        async def async_noop(ctx: Any) -> None:
            return None
    elif kind == "plain 1 ms":
        @q.handler("h")
        def plain_sleep(ctx: Any) -> None:
            time.sleep(0.001)
    else:
        @q.handler("h")
        async def async_sleep(ctx: Any) -> None:
            await asyncio.sleep(0.001)

    async with q:
        b = q.batch()
        for _ in range(n):
            b.add("h")
        await b.commit()
        t0, c0 = time.perf_counter(), time.process_time()
        await q.run_until_idle()
        took, cpu = time.perf_counter() - t0, time.process_time() - c0
    drop(url)
    return n / took, cpu / n * 1e6


def handlers(url: str, n: int, reps: int) -> None:
    print(f"\n1. handlers: {n} jobs, one worker; {reps} pairs (async then plain, or the "
          "other way round) back to back: median jobs/s, median of the pairs' ratios")
    print(f"{'capacity':>8} | {'kind':<6} | {'async':>7} | {'plain':>7} | plain/async | "
          "CPU us/job async, plain | async/plain CPU")
    for cap in (10, 50):
        for what in ("no-op", "1 ms"):
            rates: dict[str, list[float]] = {"async": [], "plain": []}
            cpus: dict[str, list[float]] = {"async": [], "plain": []}
            ratios, cpu_ratios = [], []
            for i in range(reps):
                order = ("async", "plain") if i % 2 == 0 else ("plain", "async")
                got = {k: asyncio.run(handler_rate(url, f"{k} {what}", cap, n)) for k in order}
                for k, (r, c) in got.items():
                    rates[k].append(r)
                    cpus[k].append(c)
                ratios.append(got["plain"][0] / got["async"][0])
                cpu_ratios.append(got["async"][1] / got["plain"][1])
            a, p = statistics.median(rates["async"]), statistics.median(rates["plain"])
            ca, cp = statistics.median(cpus["async"]), statistics.median(cpus["plain"])
            print(f"{cap:>8} | {what:<6} | {a:>7.0f} | {p:>7.0f} | "
                  f"{statistics.median(ratios):>11.2f} | {ca:>10.0f}, {cp:>5.0f} | "
                  f"{statistics.median(cpu_ratios):.2f}")


def enqueue(db: str, reps: int, n: int) -> None:
    import django
    from django.conf import settings

    if db == "mariadb":
        import pymysql

        pymysql.install_as_MySQLdb()
    settings.configure(
        DATABASES={"default": DJANGO_DB[db]}, USE_TZ=True,
        INSTALLED_APPS=["aiojobqueue.contrib.django"],
        TASKS={"default": {"BACKEND": "aiojobqueue.contrib.django.TaskBackend",
                           "QUEUES": [], "OPTIONS": {"prefix": PREFIX}}})
    django.setup()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from django_bench_tasks import add

    backend = add.get_backend()
    sq = backend.queue
    sq.start()

    def one_task() -> None:
        add.enqueue(1, 2)

    def one_sync() -> None:
        sq.enqueue(add.module_path, {"args": [1, 2], "kwargs": {}}, group="default",
                   priority=0)

    def pair(n: int, flip: bool) -> tuple[float, float]:
        """Seconds of n Task.enqueue() and n SyncQueue.enqueue, interleaved call by call
        (the machine's drift hits both alike)."""
        spent = {one_task: 0.0, one_sync: 0.0}
        order = (one_sync, one_task) if flip else (one_task, one_sync)
        for _ in range(n):
            for fn in order:
                t0 = time.perf_counter()
                fn()
                spent[fn] += time.perf_counter() - t0
        return spent[one_task], spent[one_sync]

    pair(20, False)  # warm up
    tasks, syncs, ratios = [], [], []
    for i in range(reps):
        t, s = pair(n, i % 2 == 1)
        tasks.append(n / t)
        syncs.append(n / s)
        ratios.append(s / t)
    print(f"\n2. enqueue one at a time: {reps} rounds of {n} pairs, interleaved call by "
          "call (enqueues/s, medians)")
    print(f"{'Task.enqueue()':>16} | {'SyncQueue.enqueue':>17} | ratio (median of rounds)")
    print(f"{statistics.median(tasks):>16.0f} | {statistics.median(syncs):>17.0f} | "
          f"{statistics.median(ratios):.2f}")
    backend.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", default="sqlite", choices=list(URLS))
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--hreps", type=int, default=3, help="pairs per handler row")
    ap.add_argument("--single", type=int, default=300)
    a = ap.parse_args()
    url = URLS[a.db]
    print(f"database: {a.db}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    try:
        handlers(url, a.jobs, a.hreps)
        enqueue(a.db, a.reps, a.single)
    finally:
        drop(url)


if __name__ == "__main__":
    main()

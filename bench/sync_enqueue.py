"""SyncQueue's enqueue rate against JobQueue's, on each database, in the same run: N single
``enqueue()`` calls and one batch of 1,000 jobs, as ``--reps`` pairs (JobQueue then
SyncQueue, or the other way round) measured back to back; the table gives medians and the
median of the pairs' SyncQueue / JobQueue ratios (the goal: >= 0.8). Both write to the same
tables, emptied every 5 pairs.

    PYTHONPATH=$PWD /work/venv/bin/python bench/sync_enqueue.py [--reps 20] [--single 100]
        [--only sqlite,postgresql,mariadb]

SQLite: a WAL file under /tmp/ajq-bench; PostgreSQL: postgres@127.0.0.1/test; MariaDB:
root@127.0.0.1/test. Tables use the prefix ``syncb_`` and are dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import create_engine

from aiojobqueue import JobQueue, SyncQueue
from aiojobqueue.dialects.urls import sync_url
from aiojobqueue.schema import build_tables

PREFIX = "syncb_"
BATCH = 1_000
URLS = {
    "sqlite": "sqlite:////tmp/ajq-bench/sync_enqueue.db",
    "postgresql": "postgresql://postgres@127.0.0.1:5432/test",
    "mariadb": "mysql://root@127.0.0.1:3306/test",
}


def rate(n: int, fn: Callable[[], Any]) -> tuple[float, float]:
    """(jobs per second of wall time, this process's CPU microseconds per job)."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return n / (time.perf_counter() - t0), (time.process_time() - c0) / n * 1e6


def measure(name: str, url: str, reps: int, n_single: int) -> dict[str, float]:
    loop = asyncio.new_event_loop()
    aq = JobQueue(url, prefix=PREFIX)
    loop.run_until_complete(aq.start())
    sq = SyncQueue(url, prefix=PREFIX)
    sq.start()
    wipe = create_engine(sync_url(url))
    t = build_tables(PREFIX)

    def empty() -> None:
        with wipe.begin() as c:
            c.execute(t.deps.delete())
            c.execute(t.jobs.delete())

    async def a_single() -> None:
        for _ in range(n_single):
            await aq.enqueue("noop", {"ts": 0.0})

    async def a_batch() -> None:
        async with aq.batch() as b:
            for _ in range(BATCH):
                b.add("noop", {"ts": 0.0})

    def s_single() -> None:
        for _ in range(n_single):
            sq.enqueue("noop", {"ts": 0.0})

    def s_batch() -> None:
        with sq.batch() as b:
            for _ in range(BATCH):
                b.add("noop", {"ts": 0.0})

    got: dict[str, list[tuple[float, float]]] = {k: [] for k in ("a1", "s1", "ab", "sb")}
    try:
        s_single()  # warm both up (connections, prepared statements, known groups)
        loop.run_until_complete(a_single())
        # Pairs measured back to back, who goes first alternating: the machine's speed
        # drifts between seconds, a pair's ratio much less.
        for rep in range(reps):
            if rep % 5 == 0:
                empty()
            pair = [
                ("a1", lambda: rate(n_single, lambda: loop.run_until_complete(a_single()))),
                ("s1", lambda: rate(n_single, s_single)),
            ]
            for key, fn in pair if rep % 2 == 0 else pair[::-1]:
                got[key].append(fn())
            pair = [
                ("ab", lambda: rate(BATCH, lambda: loop.run_until_complete(a_batch()))),
                ("sb", lambda: rate(BATCH, s_batch)),
            ]
            for key, fn in pair if rep % 2 == 0 else pair[::-1]:
                got[key].append(fn())
    finally:
        sq.close()
        loop.run_until_complete(aq.close())
        loop.close()
        with wipe.begin() as c:
            t.metadata.drop_all(c)
        wipe.dispose()
    med = {k: statistics.median(r for r, _ in v) for k, v in got.items()}
    med.update({f"{k}_cpu": statistics.median(c for _, c in v) for k, v in got.items()})
    # per-pair ratios (each pair measured back to back), their median; by CPU: JobQueue's
    # CPU per job over SyncQueue's (above 1: SyncQueue spends less)
    for a, s_, r in (("a1", "s1", "r1"), ("ab", "sb", "rb")):
        med[r] = statistics.median(
            s[0] / a_[0] for s, a_ in zip(got[s_], got[a], strict=True))
        med[r + "_cpu"] = statistics.median(
            a_[1] / s[1] for s, a_ in zip(got[s_], got[a], strict=True))
    return med


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--single", type=int, default=100)
    ap.add_argument("--only", default="sqlite,postgresql,mariadb")
    args = ap.parse_args()
    os.makedirs("/tmp/ajq-bench", exist_ok=True)
    rows = []
    for name in args.only.split(","):
        m = measure(name, URLS[name], args.reps, args.single)
        rows.append((name, m))
        print(f"(done: {name})", flush=True)
    print()
    print(f"| database | JobQueue single/s | SyncQueue single/s | ratio | "
          f"JobQueue batch of {BATCH:,} jobs/s | SyncQueue batch jobs/s | ratio |")
    print("|---|---|---|---|---|---|---|")
    for name, m in rows:
        print(f"| {name} | {m['a1']:,.0f} | {m['s1']:,.0f} | **{m['r1']:.2f}** | "
              f"{m['ab']:,.0f} | {m['sb']:,.0f} | **{m['rb']:.2f}** |")
    print(f"\nmedians of {args.reps} alternated pairs; ratio: the median of the pairs' "
          "SyncQueue / JobQueue rates")
    print("\nThis process's CPU per job (microseconds; steadier than wall time on a loaded "
          "machine), ratio JobQueue / SyncQueue:\n")
    print("| database | JobQueue single | SyncQueue single | ratio | JobQueue batch | "
          "SyncQueue batch | ratio |")
    print("|---|---|---|---|---|---|---|")
    for name, m in rows:
        print(f"| {name} | {m['a1_cpu']:,.0f} | {m['s1_cpu']:,.0f} | **{m['r1_cpu']:.2f}** | "
              f"{m['ab_cpu']:,.1f} | {m['sb_cpu']:,.1f} | **{m['rb_cpu']:.2f}** |")


if __name__ == "__main__":
    main()

"""Enqueue rates on SQLite and MariaDB (no peer to compare with there): one batch of 10,000
jobs and 1,000 single ``enqueue()`` calls, like the PostgreSQL ``enqueue`` scenario of
run.py. For a before/after, run it on both trees (PYTHONPATH picks the tree):

    PYTHONPATH=$PWD /tmp/peers-venv/bin/python bench/enqueue_dbs.py [--reps 3]

SQLite: a WAL file under /tmp/ajq-bench (synchronous=FULL); MariaDB: root@127.0.0.1, database
``enqbench`` (created if missing). Tables use the prefix ``enqb_`` and are emptied per rep.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

N_BATCH, N_SINGLE = 10_000, 1_000


async def measure(url: str, name: str, reps: int) -> None:
    from aiojobqueue import JobQueue

    for _ in range(reps):
        async with JobQueue(url, prefix="enqb_") as q:
            async with q.engine.begin() as conn:
                for table in ("enqb_deps", "enqb_jobs"):
                    await conn.exec_driver_sql(f"DELETE FROM {table}")
            t0 = time.perf_counter()
            async with q.batch() as b:
                for _ in range(N_BATCH):
                    b.add("noop", {"ts": 0.0})
            batch = N_BATCH / (time.perf_counter() - t0)
            t0 = time.perf_counter()
            for _ in range(N_SINGLE):
                await q.enqueue("noop", {"ts": 0.0})
            single = N_SINGLE / (time.perf_counter() - t0)
        print(f"{name:8s} batch of 10,000 {batch:9,.0f}/s   1,000 x enqueue() {single:7,.0f}/s",
              flush=True)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="sqlite,mariadb")
    args = ap.parse_args()
    if "sqlite" in args.only:
        os.makedirs("/tmp/ajq-bench", exist_ok=True)
        await measure("sqlite+aiosqlite:////tmp/ajq-bench/enqueue.db", "sqlite", args.reps)
    if "mariadb" in args.only:
        import pymysql

        c = pymysql.connect(host="127.0.0.1", user="root")
        c.cursor().execute("CREATE DATABASE IF NOT EXISTS enqbench")
        c.close()
        await measure("mysql+aiomysql://root@127.0.0.1:3306/enqbench", "mariadb", args.reps)


if __name__ == "__main__":
    asyncio.run(main())

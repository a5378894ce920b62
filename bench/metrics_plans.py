"""The ``aiojobqueue_jobs`` gauge next to a large table of finished jobs: plans and timings.

    python bench/metrics_plans.py [sqlite|postgresql|mariadb ...] [--finished 1000000]

Fills the jobs table with ``--finished`` done jobs (one server-side INSERT ... SELECT) and a
few live ones, analyzes it, then prints the plan of each gauge query and the time of one
whole gauge read (every counted state), the median of ``--runs``. The tests use ``fill`` and
``plans`` at a smaller size (tests/queue/test_metrics.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from aiojobqueue import JobQueue
from aiojobqueue.metrics import gauge_queries

URLS = {
    "postgresql": os.environ.get("AIOJOBQUEUE_TEST_PG",
                                 "postgresql+asyncpg://postgres@127.0.0.1:5432/test"),
    "mariadb": os.environ.get("AIOJOBQUEUE_TEST_MYSQL", "mysql+aiomysql://root@127.0.0.1:3306/test"),
}
COLUMNS = ("type, kind, state, args, group_key, weight, priority, pending, run_after, "
           "attempts, max_attempts, attempt_limit, cancel_requested, created_at, "
           "finished_at, has_dependents")


async def fill(q: JobQueue, finished: int) -> None:
    """``finished`` done jobs in 10 groups, then 6 ready, 3 scheduled, 2 running and 3
    waiting (on a scheduled one)."""
    J = q._t.jobs
    async with q.engine.begin() as conn:
        name = conn.dialect.name
        if name == "postgresql":
            sql = (f"INSERT INTO {J.name} ({COLUMNS}) SELECT 'old', 'job', 'done', '{{}}'::jsonb, "
                   "'g' || (i % 10), 1, 0, 0, now(), 1, 3, 3, false, now(), now(), false "
                   f"FROM generate_series(1, {finished}) AS i")
        elif name == "mysql":
            sql = (f"INSERT INTO {J.name} ({COLUMNS}) SELECT 'old', 'job', 'done', '{{}}', "
                   "concat('g', seq % 10), 1, 0, 0, UTC_TIMESTAMP(6), 1, 3, 3, 0, "
                   f"UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 0 FROM seq_1_to_{finished}")
        else:
            now = "((julianday('now') - 2440587.5) * 86400.0)"
            sql = (f"WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c "
                   f"WHERE i < {finished}) INSERT INTO {J.name} ({COLUMNS}) SELECT 'old', "
                   f"'job', 'done', '{{}}', 'g' || (i % 10), 1, 0, 0, {now}, 1, 3, 3, 0, "
                   f"{now}, {now}, 0 FROM c")
        await conn.execute(text(sql))
    ready = [await q.enqueue("live", group=f"g{i % 2}") for i in range(8)]
    later = [await q.enqueue("live", group="g1", run_after=timedelta(hours=1))
             for _ in range(3)]
    for _ in range(3):
        await q.enqueue("live", group="g2", depends_on=later[:1])
    async with q.engine.begin() as conn:
        await conn.execute(update(J).where(J.c.id.in_(ready[:2])).values(
            state="running", lease_owner="w", attempts=1))
        if name == "postgresql":
            await conn.execute(text(f"ANALYZE {J.name}"))
        elif name == "mysql":
            await conn.execute(text(f"ANALYZE TABLE {J.name}"))
        else:
            await conn.execute(text("ANALYZE"))


async def plans(q: JobQueue, conn: AsyncConnection) -> dict[str, list[str]]:
    """The plan of each gauge query, one line per plan row."""
    name = conn.dialect.name
    explain = {"postgresql": "EXPLAIN ", "mysql": "EXPLAIN ", "sqlite": "EXPLAIN QUERY PLAN "}
    out: dict[str, list[str]] = {}
    for state, stmt in gauge_queries(q._t):
        sql = str(stmt.compile(conn.sync_connection, compile_kwargs={"literal_binds": True}))
        rows = (await conn.execute(text(explain[name] + sql))).mappings().all()
        if name == "postgresql":
            out[state] = [r["QUERY PLAN"] for r in rows]
        elif name == "mysql":
            out[state] = [f"table={r['table']} type={r['type']} key={r['key']} "
                          f"rows={r['rows']} extra={r['Extra']}" for r in rows]
        else:
            out[state] = [str(r["detail"]) for r in rows]
    return out


async def read_all(q: JobQueue) -> dict[Any, int]:
    async with q.engine.connect() as conn:
        counts = {}
        for state, stmt in gauge_queries(q._t):
            for group, n in await conn.execute(stmt):
                counts[(state, group)] = n
        return counts


async def one(db: str, finished: int, runs: int) -> None:
    url = URLS.get(db) or f"sqlite+aiosqlite:///{tempfile.mkdtemp()}/bench.db"
    q = JobQueue(url, prefix=f"m{uuid.uuid4().hex[:8]}_")
    async with q:
        try:
            t0 = time.perf_counter()
            await fill(q, finished)
            print(f"== {db}: {finished} finished jobs (filled in {time.perf_counter() - t0:.1f}s)")
            async with q.engine.connect() as conn:
                for state, lines in (await plans(q, conn)).items():
                    print(f"-- {state}")
                    for line in lines:
                        print("   ", line)
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                counts = await read_all(q)
                times.append(time.perf_counter() - t0)
            print(f"counts {sorted(counts.items())}")
            ms = statistics.median(times) * 1000
            print(f"one gauge read ({len(gauge_queries(q._t))} queries): median {ms:.2f} ms "
                  f"over {runs}")
        finally:
            async with q.engine.begin() as conn:
                await conn.run_sync(q._t.metadata.drop_all)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dbs", nargs="*", default=["sqlite", "postgresql", "mariadb"])
    ap.add_argument("--finished", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=20)
    a = ap.parse_args()
    for db in a.dbs:
        asyncio.run(one(db, a.finished, a.runs))


if __name__ == "__main__":
    main()

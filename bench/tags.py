"""A tag filter on a large table: 1M finished + 100k live jobs, every one tagged.

    .venv/bin/python bench/tags.py [sqlite|postgresql|mariadb ...] [--finished 1000000]
        [--live 100000] [--runs 10]

Fills the jobs table with server-side INSERT ... SELECT (``--finished`` done jobs, then
``--live`` ready ones) and tags them the same way: every job ``cust-<id % 2000>`` (about
550 jobs a tag), every tenth also ``eu`` (about 110k jobs), and five jobs ``invoice-1``
(rare). Analyzes, then times each read a user makes by tag, the median and worst of
``--runs`` (after one warm-up): ``aiojobqueue jobs --tag`` (admin.list_jobs, 50 rows),
the dashboard's ``/jobs`` and ``/api/jobs`` page (web Data.jobs, alone and with a state),
the dashboard's bulk-action count (Data.match_ids) and the bulk retry/cancel read
(tags.matching). The bar: each under 300 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sqlalchemy import text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aiojobqueue import JobQueue, admin  # noqa: E402
from aiojobqueue.tags import matching  # noqa: E402
from aiojobqueue.web import data as Q  # noqa: E402

URLS = {
    "postgresql": os.environ.get("AIOJOBQUEUE_TEST_PG",
                                 "postgresql+asyncpg://postgres@127.0.0.1:5432/test"),
    "mariadb": os.environ.get("AIOJOBQUEUE_TEST_MYSQL", "mysql+aiomysql://root@127.0.0.1:3306/test"),
}
COLUMNS = ("type, kind, state, args, group_key, weight, priority, pending, run_after, "
           "attempts, max_attempts, attempt_limit, cancel_requested, created_at, "
           "finished_at, has_dependents")


def _rows_sql(name: str, table: str, n: int, state: str) -> str:
    """INSERT ... SELECT of ``n`` jobs in ``state`` (done ones with a finish time)."""
    fin = state == "done"
    if name == "postgresql":
        return (f"INSERT INTO {table} ({COLUMNS}) SELECT 'bench', 'job', '{state}', "
                "'{}'::jsonb, 'g' || (i % 20), 1, 0, 0, now(), 1, 3, 3, false, now(), "
                f"{'now()' if fin else 'NULL'}, false FROM generate_series(1, {n}) AS i")
    if name == "mysql":
        return (f"INSERT INTO {table} ({COLUMNS}) SELECT 'bench', 'job', '{state}', '{{}}', "
                "concat('g', seq % 20), 1, 0, 0, UTC_TIMESTAMP(6), 1, 3, 3, 0, "
                f"UTC_TIMESTAMP(6), {'UTC_TIMESTAMP(6)' if fin else 'NULL'}, 0 "
                f"FROM seq_1_to_{n}")
    now = "((julianday('now') - 2440587.5) * 86400.0)"
    return (f"WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < {n}) "
            f"INSERT INTO {table} ({COLUMNS}) SELECT 'bench', 'job', '{state}', '{{}}', "
            f"'g' || (i % 20), 1, 0, 0, {now}, 1, 3, 3, 0, {now}, "
            f"{now if fin else 'NULL'}, 0 FROM c")


async def fill(q: JobQueue, finished: int, live: int) -> None:
    """The jobs and their tags (see the module docstring), then ANALYZE."""
    J, T = q._t.jobs.name, q._t.tags.name
    async with q.engine.begin() as conn:
        name = conn.dialect.name
        await conn.execute(text(_rows_sql(name, J, finished, "done")))
        await conn.execute(text(_rows_sql(name, J, live, "ready")))
        cat = "concat('cust-', id % 2000)" if name == "mysql" else "'cust-' || (id % 2000)"
        await conn.execute(text(f"INSERT INTO {T} (job_id, tag) SELECT id, {cat} FROM {J}"))
        await conn.execute(text(f"INSERT INTO {T} (job_id, tag) SELECT id, 'eu' FROM {J} "
                                "WHERE id % 10 = 0"))
        await conn.execute(text(f"INSERT INTO {T} (job_id, tag) SELECT id, 'invoice-1' "
                                f"FROM {J} WHERE id % 200000 = 7"))
        analyze = {"postgresql": "ANALYZE {}", "mysql": "ANALYZE TABLE {}"}.get(name)
        if analyze is None:
            await conn.execute(text("ANALYZE"))
        else:
            for t in (J, T):
                await conn.execute(text(analyze.format(t)))


def reads(q: JobQueue, tag: str) -> list[tuple[str, Callable[[], Awaitable[int]]]]:
    """(label, read returning its row count) for one tag."""
    data = Q.Data(q)

    async def cli() -> int:
        return len(await admin.list_jobs(q, tag=tag))

    async def page() -> int:
        return len((await data.jobs(Q.Filters(tag=tag))).rows)

    async def page_state() -> int:
        return len((await data.jobs(Q.Filters(state="ready", tag=tag))).rows)

    async def bulk_count() -> int:
        return (await data.match_ids(Q.Filters(tag=tag), Q.RETRYABLE))[1].n

    async def bulk_read() -> int:
        return len(await matching(q, tag, ("failed", "cancelled")))

    return [("jobs --tag (50)", cli), ("/api/jobs?tag", page), ("/api/jobs?tag&state", page_state),
            ("bulk retry count", bulk_count), ("retry_tagged read", bulk_read)]


async def time_it(fn: Callable[[], Awaitable[int]], runs: int) -> tuple[int, float, float]:
    n = await fn()  # warm-up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        await fn()
        times.append((time.perf_counter() - t0) * 1000)
    return n, statistics.median(times), max(times)


async def one(db: str, finished: int, live: int, runs: int) -> list[tuple[Any, ...]]:
    url = URLS.get(db) or f"sqlite+aiosqlite:///{tempfile.mkdtemp()}/bench.db"
    q = JobQueue(url, prefix=f"bt{uuid.uuid4().hex[:8]}_")
    out = []
    async with q:
        try:
            t0 = time.perf_counter()
            await fill(q, finished, live)
            print(f"# {db}: {finished:,} done + {live:,} ready, tagged in "
                  f"{time.perf_counter() - t0:.0f}s", flush=True)
            for tag in ("invoice-1", "cust-7", "eu"):
                for label, fn in reads(q, tag):
                    n, med, worst = await time_it(fn, runs)
                    out.append((db, tag, label, n, med, worst))
                    print(f"{db:10} {tag:10} {label:22} {n:6} {med:8.1f} {worst:8.1f}",
                          flush=True)
        finally:
            async with q.engine.begin() as conn:
                await conn.run_sync(q._t.metadata.drop_all)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dbs", nargs="*", default=["sqlite", "postgresql", "mariadb"])
    ap.add_argument("--finished", type=int, default=1_000_000)
    ap.add_argument("--live", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=10)
    a = ap.parse_args()
    rows = []
    for db in a.dbs:
        rows += asyncio.run(one(db, a.finished, a.live, a.runs))
    print(f"\n{'database':10} {'tag':10} {'read':22} {'rows':>6} {'median ms':>9} "
          f"{'worst ms':>8} {'< 300 ms':>8}")
    for db, tag, label, n, med, worst in rows:
        print(f"{db:10} {tag:10} {label:22} {n:6} {med:9.1f} {worst:8.1f} "
              f"{'yes' if worst < 300 else 'NO':>8}")


if __name__ == "__main__":
    main()

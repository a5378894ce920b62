"""How the fair-share claim scales with a deep backlog: plans and timings per database.

    python bench/claim_explain.py [sqlite|postgresql|mariadb ...] [--backlog 10000]

Fills one group with a backlog (plus a few small groups), then prints the plan of the
group-discovery query (the one that feeds fair_share) and times it and the whole claim
transaction (rolled back, so every run sees the same backlog).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import tempfile
import time
import uuid
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from aiojobqueue import JobQueue
from aiojobqueue.census import group_demand_query
from aiojobqueue.schema import build_tables

URLS = {
    "postgresql": os.environ.get("AIOJOBQUEUE_TEST_PG",
                                 "postgresql+asyncpg://postgres@127.0.0.1:5432/test"),
    "mariadb": os.environ.get("AIOJOBQUEUE_TEST_MYSQL", "mysql+aiomysql://root@127.0.0.1:3306/test"),
}


class _Rollback(Exception):
    pass


async def one(db: str, backlog: int, runs: int) -> None:
    url = URLS.get(db) or f"sqlite+aiosqlite:///{tempfile.mkdtemp()}/bench.db"
    prefix = f"b{uuid.uuid4().hex[:8]}_"
    q = JobQueue(url, prefix=prefix, concurrency=10)
    async with q:
        try:
            async with q.batch() as b:
                for _ in range(backlog):
                    b.add("w", {}, group="bulk", weight=3)
                for g in ("t1", "t2", "t3"):
                    b.add("w", {}, group=g)
            stmt = group_demand_query(q._t, ["w"])
            async with q.engine.connect() as conn:
                if db == "postgresql":
                    await conn.execute(text(f"ANALYZE {prefix}jobs"))
                sql = str(stmt.compile(conn, compile_kwargs={"literal_binds": True}))
                explain = {"postgresql": "EXPLAIN (ANALYZE, COSTS OFF) ", "mariadb": "EXPLAIN ",
                           "sqlite": "EXPLAIN QUERY PLAN "}[db]
                plan = (await conn.execute(text(explain + sql))).all()
            print(f"== {db}: backlog {backlog} in one group + 3 groups of 1")
            for row in plan:
                print("   ", " | ".join(str(c) for c in row if c is not None))
            t_disc, t_claim = [], []
            for _ in range(runs):
                async with q.engine.connect() as conn:
                    t = time.perf_counter()
                    await conn.execute(stmt)
                    t_disc.append(time.perf_counter() - t)
                    await conn.rollback()

                async def timed(conn: AsyncConnection) -> Any:
                    t = time.perf_counter()
                    assert q._core is not None
                    got = await q._core.claimer.claim(conn, 10, ["w"])
                    t_claim.append(time.perf_counter() - t)
                    assert len(got) == 10
                    raise _Rollback

                with contextlib.suppress(_Rollback):
                    await q._write(timed)
            print(f"   group discovery: median {statistics.median(t_disc) * 1000:.2f} ms; "
                  f"whole claim of 10: median {statistics.median(t_claim) * 1000:.2f} ms "
                  f"({runs} runs)")
        finally:
            if db != "sqlite":
                async with q.engine.begin() as conn:
                    await conn.run_sync(build_tables(prefix).metadata.drop_all)


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dbs", nargs="*", default=["sqlite", "postgresql", "mariadb"])
    p.add_argument("--backlog", type=int, default=10_000)
    p.add_argument("--runs", type=int, default=20)
    a = p.parse_args()
    for db in a.dbs:
        await one(db, a.backlog, a.runs)


if __name__ == "__main__":
    asyncio.run(main())

"""What one job costs the database in writes, A/B between two code trees in the same run.

    .venv/bin/python bench/writes_ab.py --old /path/to/other/tree [--new .]
        [--dbs postgresql,mariadb] [--jobs 5000] [--dags 100] [--reps 2]

Per database, the trees alternate A B A B. Each measurement runs in a child process with
``PYTHONPATH`` set to its tree (bench/abtree.py): on a fresh table prefix it enqueues
``--jobs`` no-op jobs over 20 groups and ``--dags`` DAGs (a container of four chained jobs
and a job after it, as bench/soak.py offers them), then one worker (``capacity=16``) drains
them with ``run_until_idle()``. Counted from just before the drain to just after it, so the
inserts are left out and what is counted is the claim and the finalize:

- PostgreSQL: WAL bytes per job (``pg_current_wal_lsn()``), dead tuples made per job (the
  jobs table's row updates and deletes: each leaves one) and how many of the updates were
  HOT (no index entry written);
- MySQL/MariaDB: redo log bytes per job (``Innodb_lsn_current``: the server's, so nothing
  else may write to the server meanwhile) and the jobs table's index size after the drain.

Bytes and tuples per job do not drift with the machine's load, so one or two reps suffice.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from abtree import run_in_tree  # noqa: E402

URLS = {
    "postgresql": os.environ.get("AIOJOBQUEUE_TEST_PG",
                                 "postgresql+asyncpg://postgres@127.0.0.1:5432/test"),
    "mariadb": os.environ.get("AIOJOBQUEUE_TEST_MYSQL", "mysql+aiomysql://root@127.0.0.1:3306/test"),
}


async def counters(engine: Any, db: str, table: str) -> dict[str, float]:
    from sqlalchemy import text

    await asyncio.sleep(1.2)  # PostgreSQL's backends report their counters within a second
    async with engine.connect() as c:
        c = await c.execution_options(isolation_level="AUTOCOMMIT")
        if db == "postgresql":
            await c.execute(text("SELECT pg_stat_clear_snapshot()"))
            r = (await c.execute(text(
                "SELECT pg_current_wal_lsn() - '0/0', n_tup_upd + n_tup_del, n_tup_hot_upd "
                f"FROM pg_stat_user_tables WHERE relname = '{table}'"))).one()
            return {"log": float(r[0]), "dead": float(r[1]), "hot": float(r[2])}
        lsn = (await c.execute(text("SHOW GLOBAL STATUS LIKE 'Innodb_lsn_current'"))).one()[1]
        await c.execute(text(f"ANALYZE TABLE {table}"))
        idx = (await c.execute(text(
            "SELECT index_length FROM information_schema.TABLES "
            f"WHERE table_schema = DATABASE() AND table_name = '{table}'"))).scalar()
        return {"log": float(lsn), "index": float(idx or 0)}


async def measure(db: str, jobs: int, dags: int) -> dict[str, Any]:
    """One drain with the ``aiojobqueue`` on ``PYTHONPATH``."""
    from sqlalchemy.ext.asyncio import create_async_engine

    import aiojobqueue
    from aiojobqueue import JobContext, JobQueue

    url = URLS[db]
    prefix = f"wab{uuid.uuid4().hex[:6]}_"
    engine = create_async_engine(url)
    table = f"{prefix}jobs"
    try:
        async with JobQueue(url, prefix=prefix) as q:  # the jobs, enqueued
            async with q.batch() as b:
                for i in range(jobs):
                    b.add("work", {"i": i}, group=f"tenant{i % 20}")
            for d in range(dags):
                async with q.batch() as b:
                    box = b.container("dag", group=f"tenant{d % 20}")
                    prev = None
                    for i in range(4):
                        prev = b.add("work", {"i": i}, parent=box,
                                     depends_on=[prev] if prev else [])
                    b.add("work", {"i": 5}, depends_on=[box], group=f"tenant{d % 20}")
        n = jobs + dags * 6
        # counted between two closed queues: a PostgreSQL backend reports its counters when
        # it exits (an idle pooled one may hold them for 10 s)
        before = await counters(engine, db, table)
        q = JobQueue(url, prefix=prefix, capacity=16, poll_interval=0.05)

        @q.handler("work")
        async def work(ctx: JobContext, i: int) -> None:
            return None

        async with q:
            await q.run_until_idle()
        after = await counters(engine, db, table)
        async with engine.begin() as conn:
            await conn.run_sync(q._t.metadata.drop_all)
    finally:
        await engine.dispose()
    tree = os.path.dirname(os.path.dirname(os.path.realpath(aiojobqueue.__file__)))  # noqa: ASYNC240
    out: dict[str, Any] = {"tree": tree,
                           "log": (after["log"] - before["log"]) / n}
    if db == "postgresql":
        out["dead"] = (after["dead"] - before["dead"]) / n
        out["hot"] = (after["hot"] - before["hot"]) / n
    else:
        out["index"] = after["index"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", default=str(ROOT.parent))
    ap.add_argument("--dbs", default="postgresql,mariadb")
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--dags", type=int, default=100)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    trees = {"old": str(Path(a.old).resolve()), "new": str(Path(a.new).resolve())}
    print(f"# writes per job: {a.jobs} jobs + {a.dags} DAGs of 6, one worker x 16, "
          f"old = {trees['old']}, new = {trees['new']}, load {os.getloadavg()[0]:.1f}")
    print(f"{'db':<11} {'tree':<4} {'log B/job':>10} {'dead/job':>9} {'hot/job':>8} "
          f"{'index MB':>9}  reps")
    for db in a.dbs.split(","):
        got: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
        for _ in range(a.reps):
            for name in ("old", "new"):
                got[name].append(run_in_tree(
                    __file__, trees[name], [db, str(a.jobs), str(a.dags)], f"{db} {name}"))
        for name in ("old", "new"):
            rs = got[name]

            def med(k: str, rs: list[dict[str, Any]] = rs) -> str:
                xs = [r[k] for r in rs if k in r]
                return f"{statistics.median(xs):.2f}" if xs else "-"

            logs = " ".join(f"{r['log']:.0f}" for r in rs)
            index = f"{statistics.median(r['index'] for r in rs) / 1e6:.2f}" if (
                "index" in rs[0]) else "-"
            print(f"{db:<11} {name:<4} {statistics.median(r['log'] for r in rs):10.0f} "
                  f"{med('dead'):>9} {med('hot'):>8} {index:>9}  [{logs}]", flush=True)
        new, old = (statistics.median(r["log"] for r in got[k]) for k in ("new", "old"))
        print(f"{db:<11} new/old log bytes per job: {new / old:.2f}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        db, jobs, dags = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        print(json.dumps(asyncio.run(measure(db, jobs, dags))))
    else:
        main()

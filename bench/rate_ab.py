"""RateLimit's cost, A/B between two code trees: capped / uncapped drains and statements.

    PYTHONPATH=$PWD /work/venv/bin/python bench/rate_ab.py --old /work/abtrees/main
        [--new .] [--dbs postgresql,sqlite,mariadb] [--caps 10,50] [--reps 3] [--n 5000]

Each drain is one worker process (``run_until_idle()``, no-op handlers, ``capacity=C``)
run with ``PYTHONPATH`` set to one tree, over N jobs in one group enqueued beforehand on a
fresh table prefix; every drain is checked (N jobs done). The RateLimit never binds
(``RateLimit(10**6, per=1.0)``: counted at every claim, under the gate). Per database and
C, the trees alternate A B A B, and within each tree's turn the uncapped and the capped
drain alternate too, so each ratio compares the same minutes. Statements per job are
counted in one more drain per tree, database and C (a cursor listener, which slows the
drain: kept out of the timed ones); an executemany counts one.
Prints, per database and C: each tree's median capped / uncapped ratio (and the per-rep
ratios), statements per job capped and uncapped, and the new tree's capped drain over the
old one's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from abtree import run_in_tree

URLS = {
    "postgresql": "postgresql+asyncpg://postgres@127.0.0.1:5432/test",
    "mariadb": "mysql+aiomysql://root@127.0.0.1:3306/test",
}


async def child(db: str, n: int, capacity: int, rate: bool, count: bool) -> dict[str, Any]:
    """One drain with the aiojobqueue that PYTHONPATH selects."""
    from sqlalchemy import event, func, select
    from sqlalchemy.ext.asyncio import create_async_engine

    import aiojobqueue
    from aiojobqueue import JobQueue, RateLimit
    from aiojobqueue import schema as S

    tmp = tempfile.mkdtemp()
    url = (f"sqlite+aiosqlite:///{tmp}/{uuid.uuid4().hex[:8]}.db" if db == "sqlite"
           else URLS[db])
    prefix = f"br{uuid.uuid4().hex[:8]}_"
    q = JobQueue(url, prefix=prefix, capacity=capacity,
                 limits=[RateLimit(10**6, per=1.0)] if rate else ())

    @q.handler("noop")
    async def noop(ctx: Any) -> None:
        return None

    statements = [0]
    try:
        async with q:
            for start in range(0, n, 5000):
                b = q.batch()
                for _ in range(start, min(n, start + 5000)):
                    b.add("noop", {})
                await b.commit()
            if count:
                def seen(*_: Any) -> None:
                    statements[0] += 1

                event.listen(q.engine.sync_engine, "before_cursor_execute", seen)
            t0 = time.perf_counter()
            await q.run_until_idle()
            dt = time.perf_counter() - t0
            if count:
                event.remove(q.engine.sync_engine, "before_cursor_execute", seen)
            J = q._started().db.t.jobs

            async def done(conn: Any) -> int:
                return int((await conn.execute(select(func.count()).select_from(J).where(
                    J.c.state == S.DONE))).scalar_one())

            if (got := await q._read(done)) != n:
                raise SystemExit(f"{db}: drain incomplete: {got}/{n}")
    finally:
        if db != "sqlite":
            engine = create_async_engine(url)
            try:
                async with engine.begin() as conn:
                    await conn.run_sync(S.build_tables(prefix).metadata.drop_all)
            finally:
                await engine.dispose()
    return {"rate": n / dt, "stmts": statements[0] / n, "tree": aiojobqueue.__file__}


def run(tree: str, db: str, n: int, c: int, rate: bool, count: bool = False) -> dict[str, Any]:
    return run_in_tree(__file__, tree, [db, str(n), str(c), str(int(rate)), str(int(count))],
                       f"{db} C={c}", timeout=600)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--old", required=False)
    p.add_argument("--new", default=".")
    p.add_argument("--dbs", default="postgresql,sqlite,mariadb")
    p.add_argument("--caps", default="10,50")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--n", type=int, default=5000)
    p.add_argument("--child", nargs=5, default=None)
    a = p.parse_args()
    if a.child:
        db, n, c, rate, count = a.child
        print(json.dumps(asyncio.run(child(db, int(n), int(c), rate == "1", count == "1"))))
        return
    if not a.old:
        p.error("--old is required")
    trees = {"old": str(Path(a.old).resolve()), "new": str(Path(a.new).resolve())}
    print("| db | C | old capped/uncapped | new capped/uncapped | new/old capped "
          "| stmts/job old unc / cap | new unc / cap |")
    print("|---|---|---|---|---|---|---|")
    for db in a.dbs.split(","):
        for c in (int(x) for x in a.caps.split(",")):
            ratios: dict[str, list[float]] = {"old": [], "new": []}
            capped: dict[str, list[float]] = {"old": [], "new": []}
            for rep in range(a.reps):
                for name in ("old", "new"):
                    # alternate which variant goes first, rep by rep
                    order = (False, True) if rep % 2 == 0 else (True, False)
                    got = {v: run(trees[name], db, a.n, c, v)["rate"] for v in order}
                    ratios[name].append(got[True] / got[False])
                    capped[name].append(got[True])
            st = {(name, v): run(trees[name], db, a.n, c, v, count=True)["stmts"]
                  for name in ("old", "new") for v in (False, True)}
            vs = statistics.median(x / y for x, y in zip(capped["new"], capped["old"],
                                                         strict=True))

            def cell(xs: list[float]) -> str:
                return f"{statistics.median(xs):.2f} ({', '.join(f'{x:.2f}' for x in xs)})"

            print(f"| {db} | {c} | {cell(ratios['old'])} | {cell(ratios['new'])} | {vs:.2f} "
                  f"| {st['old', False]:.2f} / {st['old', True]:.2f} "
                  f"| {st['new', False]:.2f} / {st['new', True]:.2f} |", flush=True)


if __name__ == "__main__":
    main()

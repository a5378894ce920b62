"""Dashboard page render times on big tables: one command, one table.

    PYTHONPATH=. python bench/web_pages.py [--url URL] [--sizes 0,100000,1000000] [--plans]

For each size N it fills fresh tables with N finished jobs (95% done, 4% failed, 1%
cancelled, finished over the last 7 days) and N/10 live ones (60% ready, 25% waiting on a
dependency, 15% scheduled; with ``--all-waiting`` all waiting; across 20 groups of
weights 1-4; plus a 1,000-child container
for the DAG page), then renders every page through the ASGI app (httpx, no network) and
prints the median and the worst of ``--repeat`` renders in milliseconds. Each size runs
twice: without the overview's per-group indexes (``schema.overview_indexes``, v7, built
on PostgreSQL and SQLite only), as v6 was, then with them, as the schema is (see
docs/dashboard.md). ``--plans`` prints the query plan of every statement the overview
runs, at the largest size.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import event, insert, select

from aiojobqueue import JobQueue
from aiojobqueue.schema import build_tables, overview_indexes
from aiojobqueue.web import dashboard
from aiojobqueue.web.data import Data

GROUPS = [f"tenant-{i:02d}" for i in range(20)]
CHUNK = 5_000


async def fill(q: JobQueue, n: int, all_waiting: bool = False) -> dict[str, int]:
    """Bulk-insert the rows (Core executemany; the queue's own enqueue is not the subject)."""
    t = build_tables(q.prefix)
    J = t.jobs
    rng = random.Random(42)
    now = datetime.now(UTC)
    base = {"kind": "job", "max_attempts": 3, "attempt_limit": 3, "pending": 0,
            "priority": 0, "attempts": 1}
    ids: dict[str, int] = {}

    async def put(rows: list[dict[str, Any]]) -> None:
        async with q.engine.begin() as conn:
            for i in range(0, len(rows), CHUNK):
                await conn.execute(insert(J), rows[i : i + CHUNK])

    async with q.engine.begin() as conn:
        await conn.execute(insert(t.groups), [{"group_key": g} for g in GROUPS])
    finished = []
    for i in range(n):
        r = rng.random()
        state = "done" if r < 0.95 else "failed" if r < 0.99 else "cancelled"
        at = now - timedelta(seconds=rng.random() * 7 * 86400)
        err = None if state == "done" else {
            "type": "TimeoutError" if i % 3 else "OSError",
            "message": f"attempt {i}: upstream timed out" if i % 3 else "connection reset",
            "traceback": "Traceback (most recent call last):\n  ...\n"}
        finished.append({**base, "type": rng.choice(["fetch", "parse", "render"]),
                         "state": state, "args": {"i": i}, "result": {"ok": i} if
                         state == "done" else None, "error": err,
                         "group_key": rng.choice(GROUPS), "weight": 1, "run_after": at,
                         "created_at": at - timedelta(seconds=30), "started_at": at,
                         "finished_at": at})
        if len(finished) >= 50_000:
            await put(finished)
            finished = []
    await put(finished)
    live = []
    for i in range(n // 10):
        r = rng.random()
        state = ("waiting" if all_waiting or 0.6 <= r < 0.85 else
                 "ready" if r < 0.6 else "scheduled")
        g = GROUPS[i % len(GROUPS)]
        live.append({**base, "attempts": 0, "type": "fetch", "state": state,
                     "args": {"u": i}, "group_key": g, "weight": 1 + GROUPS.index(g) % 4,
                     "pending": 1 if state == "waiting" else 0,
                     "run_after": now + timedelta(hours=1) if state == "scheduled" else now,
                     "created_at": now - timedelta(seconds=rng.random() * 3600)})
    await put(live)
    # a container of 1,000 children, a chain among the first ones, for the DAG page
    async with q.batch() as b:
        box = b.container("build", group=GROUPS[0])
        prev = None
        kids = []
        for i in range(1000):
            ref = b.add("step", {"i": i}, parent=box, group=GROUPS[0],
                        depends_on=[prev] if prev is not None and i < 30 else [])
            kids.append(ref)
            prev = ref
        after = b.add("report", {}, depends_on=[box], group=GROUPS[0])
    ids["dag"] = kids[10].id
    ids["after"] = after.id
    async with q.engine.connect() as conn:
        ids["failed"] = int(await conn.scalar(
            select(J.c.id).where(J.c.state == "failed").order_by(J.c.id.desc()).limit(1)) or 1)
    return ids


async def analyze(q: JobQueue) -> None:
    """Fresh statistics (and on PostgreSQL the visibility map), as autovacuum would leave
    them after a bulk load: the bench's one dialect switch."""
    name = q.engine.dialect.name
    tables = [q.prefix + s for s in ("jobs", "deps", "groups")]
    if name == "postgresql":
        async with q.engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            for t in tables:
                await conn.exec_driver_sql(f"VACUUM ANALYZE {t}")
        return
    async with q.engine.begin() as conn:
        if name == "sqlite":
            await conn.exec_driver_sql("ANALYZE")
        else:
            for t in tables:
                await conn.exec_driver_sql(f"ANALYZE TABLE {t}")


PAGES = [
    ("overview", "/"),
    ("jobs", "/jobs"),
    ("jobs ?state=failed", "/jobs?state=failed"),
    ("jobs ?state=ready&group", "/jobs?state=ready&group=tenant-03"),
    ("jobs ?q=reset (error text)", "/jobs?q=reset"),
    ("job (failed)", "/jobs/{failed}"),
    ("dag (1,000-child box)", "/jobs/{dag}/dag"),
    ("workers", "/workers"),
    ("schedules", "/schedules"),
    ("api/overview", "/api/overview"),
]


async def measure(q: JobQueue, ids: dict[str, int], repeat: int) -> dict[str, tuple[float, float]]:
    app = dashboard(q, access=lambda request: "full")
    out: dict[str, tuple[float, float]] = {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://bench") as c:
        for name, path in PAGES:
            url = path.format(**ids)
            r = await c.get(url)  # warm: compiled statements, templates
            assert r.status_code == 200, (url, r.status_code, r.text[:300])
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                r = await c.get(url)
                times.append((time.perf_counter() - t0) * 1000)
            out[name] = (statistics.median(times), max(times))
        data = Data(q)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            await data.marker()
            times.append((time.perf_counter() - t0) * 1000)
        out["live marker (1/s)"] = (statistics.median(times), max(times))
    return out


async def plans(q: JobQueue) -> None:
    """The plan of every statement the overview runs."""
    seen: list[tuple[str, Any]] = []

    def grab(conn: Any, cursor: Any, stmt: str, params: Any, ctx: Any, many: bool) -> None:
        seen.append((stmt, params))

    event.listen(q.engine.sync_engine, "before_cursor_execute", grab)
    try:
        await Data(q).overview()
    finally:
        event.remove(q.engine.sync_engine, "before_cursor_execute", grab)
    name = q.engine.dialect.name
    prefix = {"postgresql": "EXPLAIN ", "sqlite": "EXPLAIN QUERY PLAN "}.get(name, "EXPLAIN ")
    async with q.engine.connect() as conn:
        for stmt, params in seen:
            print("\n--", " ".join(stmt.split())[:300])
            rows = (await conn.exec_driver_sql(prefix + stmt, params)).all()
            for row in rows:
                print("  ", " | ".join(str(x) for x in row if x is not None))


async def one_size(url: str, n: int, repeat: int, show_plans: bool,
                   all_waiting: bool = False) -> dict[str, Any]:
    prefix = f"b{uuid.uuid4().hex[:8]}_"
    q = JobQueue(url, prefix=prefix, concurrency=50)
    async with q:
        t0 = time.perf_counter()
        ids = await fill(q, n, all_waiting)
        await analyze(q)
        filled = time.perf_counter() - t0
        print(f"# {n:,} finished + {n // 10:,} live rows in {filled:.0f} s", file=sys.stderr)
        mine = {ix.name for ix in overview_indexes(prefix)}
        built = [ix for ix in q._t.jobs.indexes if ix.name in mine]
        async with q.engine.begin() as conn:  # first as v6 was: without them
            for ix in built:
                await conn.run_sync(lambda c, ix=ix: ix.drop(c, checkfirst=True))
        before = await measure(q, ids, repeat)
        async with q.engine.begin() as conn:
            for ix in built:
                await conn.run_sync(lambda c, ix=ix: ix.create(c, checkfirst=True))
        await analyze(q)
        after = await measure(q, ids, repeat)
        if show_plans:
            await plans(q)
        async with q.engine.begin() as conn:
            await conn.run_sync(build_tables(prefix).metadata.drop_all)
    return {"before": before, "after": after}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default=None, help="database (default: a temporary SQLite file)")
    ap.add_argument("--sizes", default="0,100000,1000000")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--plans", action="store_true")
    ap.add_argument("--json", action="store_true", help="also print the figures as JSON")
    ap.add_argument("--all-waiting", action="store_true",
                    help="every live job waiting on a dependency (issue 21's 1M finished + "
                         "100k waiting)")
    a = ap.parse_args()
    url = a.url or f"sqlite+aiosqlite:///{tempfile.mkdtemp()}/bench.db"
    sizes = [int(s) for s in a.sizes.split(",")]
    results = {}
    for i, n in enumerate(sizes):
        results[n] = asyncio.run(one_size(url, n, a.repeat, a.plans and i == len(sizes) - 1,
                                          a.all_waiting))
    backend = url.split(":", 1)[0]
    print(f"\nDashboard render, ms (median / worst of {a.repeat}) on {backend}; "
          f"N finished + N/10 {'waiting' if a.all_waiting else 'live'} jobs; "
          "[v6: without the overview indexes] -> [v7, as is]")
    head = f"{'page':<28}" + "".join(f"{f'N={n:,}':>28}" for n in sizes)
    print(head)
    print("-" * len(head))
    for name in list(results[sizes[0]]["before"]):
        cells = []
        for n in sizes:
            b, x = results[n]["before"][name], results[n]["after"][name]
            cells.append(f"{b[0]:6.1f}/{b[1]:6.1f} -> {x[0]:5.1f}/{x[1]:5.1f}")
        print(f"{name:<28}" + "".join(f"{c:>28}" for c in cells))
    if a.json:
        print(json.dumps({str(k): v for k, v in results.items()}))


if __name__ == "__main__":
    main()

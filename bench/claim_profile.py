"""Where a many-group drain's statements go (issue 18): one drain of N no-op jobs over G
groups (as bench/fairshare.py's ``groups`` rows), every statement counted and timed by
kind through SQLAlchemy's cursor events, per claim and per job.

    PYTHONPATH=$PWD /work/venv/bin/python bench/claim_profile.py [--db postgresql]
        [--n 20000] [--groups 1,100,1000]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

KINDS = [("sa(g, n)", "fair pick"), ("census_scan", "census"), ("idle_scan", "idle pick"),
         ("unnest", "many pick"),
         ("pg_advisory", "gate"), ("aiojobqueue_settle", "routine"), ("SET state=", "")]


def kind(sql: str) -> str:
    for mark, name in KINDS[:-1]:
        if mark in sql:
            return name
    head = " ".join(sql.split()[:3]).lower()
    if head.startswith("update") and "RETURNING" in sql and "'running'" not in sql.split(
            "WHERE", 1)[0] and "lease_owner=" in sql:
        return "pick (one group)"
    if head.startswith("update"):
        return "update (finalize/other)"
    return head[:40]


async def one(db: str, n: int, groups: int) -> None:
    import fairshare as F
    from sqlalchemy import event

    from aiojobqueue import JobQueue
    from aiojobqueue.claim import Claimer

    with tempfile.TemporaryDirectory() as tmp:
        url, prefix = F.url_for(db, tmp), f"bp{uuid.uuid4().hex[:8]}_"
        q = JobQueue(url, prefix=prefix, capacity=10)

        @q.handler("noop")
        async def noop(ctx: Any) -> None:
            return None

        counts: dict[str, int] = defaultdict(int)
        spent: dict[str, float] = defaultdict(float)
        on = [False]
        claims = [0, 0]  # claims, jobs they leased
        orig = Claimer.claim

        async def claim(self: Any, *a: Any, **k: Any) -> Any:
            got = await orig(self, *a, **k)
            if on[0]:
                claims[0] += 1
                claims[1] += len(got)
            return got

        Claimer.claim = claim  # type: ignore[method-assign]
        try:
            async with q:
                eng = q.engine.sync_engine

                @event.listens_for(eng, "before_cursor_execute")
                def before(conn: Any, cur: Any, sql: str, params: Any, ctx: Any, many: Any
                           ) -> None:
                    conn.info["t0"] = time.perf_counter()

                @event.listens_for(eng, "after_cursor_execute")
                def after(conn: Any, cur: Any, sql: str, params: Any, ctx: Any, many: Any
                          ) -> None:
                    if on[0]:
                        k = kind(sql)
                        counts[k] += 1
                        spent[k] += time.perf_counter() - conn.info["t0"]

                await F.enqueue(q, n, groups)
                on[0] = True
                t0 = time.perf_counter()
                await q.run_until_idle()
                dt = time.perf_counter() - t0
                on[0] = False
        finally:
            Claimer.claim = orig  # type: ignore[method-assign]
            await F.drop(url, prefix)
    print(f"\n## {db} groups={groups}: {n / dt:,.0f} jobs/s; {claims[0]} claims, "
          f"{claims[1] / max(claims[0], 1):.1f} jobs per claim (direct claim() calls)")
    print("| statement | count | per job | ms each | ms total |")
    print("|---|---|---|---|---|")
    for k in sorted(counts, key=lambda k: -spent[k]):
        print(f"| {k} | {counts[k]} | {counts[k] / n:.3f} | {spent[k] / counts[k] * 1e3:.2f}"
              f" | {spent[k] * 1e3:.0f} |")
    total = sum(counts.values())
    print(f"| all | {total} | {total / n:.3f} | | {sum(spent.values()) * 1e3:.0f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--db", default="postgresql")
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--groups", default="1,100,1000")
    a = p.parse_args()
    for g in a.groups.split(","):
        asyncio.run(one(a.db, a.n, int(g)))


if __name__ == "__main__":
    main()

"""Fair share and caps at scale (issue 18): one table of drain rates and same-run ratios.

    PYTHONPATH=$PWD /work/venv/bin/python bench/fairshare.py [--dbs postgresql,sqlite,mariadb]
        [--n 3000] [--groups 1,10,100,1000] [--stale 10000] [--caps 10,50] [--reps 1]
        [--only groups,stale,cap]

Each row is one worker process running ``run_until_idle()`` over jobs enqueued beforehand
(no-op handlers, ``capacity=10`` unless said), on a fresh table prefix, timed by wall clock
around the drain; every drain is checked (all jobs done). Rows of one database are measured
alternately within each rep, so their ratios compare the same minutes:

* ``groups``: N jobs spread round-robin over G groups, against G = 1 (target >= 0.8);
* ``stale``: N jobs in 10 groups after ``--stale`` other groups once had jobs (one job
  each, finished; on PostgreSQL vacuumed since, and once more right after they finished),
  against the same drain on a fresh database (target >= 0.9);
* ``cap``: N jobs in one group with ``capacity=C`` and a global ``concurrency=C``, with
  ``group_limits`` capping that group at C, and with a ``RateLimit`` it never reaches
  (10**6 starts per second: counted at every claim, under the gate), each against
  ``capacity=C`` alone (target >= 0.7);
* ``turnover``: ``--turn-jobs`` jobs of 50 ms under ``concurrency=8`` served by 3 worker
  processes (tests/sched_worker.py: capacity 10, poll 0.05 s), from their interval logs:
  how busy the 8 slots were between the first start and the last end (target >= 95 %,
  MariaDB 90 %), the time from a job's end to the next start it made room for (median,
  p99), and the most jobs seen running at once (never above 8);
* ``peer`` (PostgreSQL): PgQueuer 1.6 draining the same N jobs in a database of its own
  (/work/shared/bench-peers/peer_pgqueuer.py, read-only), with its defaults (batch 10, no
  cap) and with ``max_concurrent_tasks=10``; each ``groups`` row is also given against
  the faster of the two (PgQueuer has no tenants).
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

URLS = {
    "postgresql": "postgresql+asyncpg://postgres@127.0.0.1:5432/test",
    "mariadb": "mysql+aiomysql://root@127.0.0.1:3306/test",
}


def url_for(db: str, tmp: str) -> str:
    if db == "sqlite":
        return f"sqlite+aiosqlite:///{tmp}/{uuid.uuid4().hex[:8]}.db"
    return URLS[db]


async def drop(url: str, prefix: str) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    from aiojobqueue.schema import build_tables

    if url.startswith("sqlite"):
        os.unlink(url.split(":///", 1)[1])
        return
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(build_tables(prefix).metadata.drop_all)
    finally:
        await engine.dispose()


async def enqueue(q: Any, n: int, groups: int, tag: str = "g") -> None:
    for start in range(0, n, 5000):
        b = q.batch()
        for i in range(start, min(n, start + 5000)):
            b.add("noop", {}, group=f"{tag}{i % groups:06d}")
        await b.commit()


async def stale_groups(q: Any, count: int, vacuum: bool) -> None:
    """``count`` groups that once had a job each, now finished (with ``vacuum``, on
    PostgreSQL vacuumed since, on MySQL/MariaDB purged since)."""
    from sqlalchemy import update

    from aiojobqueue import schema as S

    await enqueue(q, count, count, tag="old")
    J = q._started().db.t.jobs

    async def finish(conn: Any) -> None:
        await conn.execute(update(J).where(J.c.group_key.like("old%")).values(
            state=S.DONE, live_key=None, finished_at=J.c.created_at))

    await q._write(finish)
    if vacuum and q.engine.dialect.name == "postgresql":
        # "once had jobs": long enough ago that autovacuum has been by (the ready-index
        # entries of the finished jobs are gone, as they are on a live system)
        async with q.engine.connect() as conn:
            auto = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await auto.exec_driver_sql(f"VACUUM {J.name}")
    if vacuum and q.engine.dialect.name in ("mysql", "mariadb"):
        # the same on InnoDB: its purge removes the finished jobs' ready-index entries
        # (delete-marked until then, read by every census). No status says when it is done
        # (the history list counts transactions, and this was one): measured here, a
        # census reads as on a fresh table 10 s after 100,000 rows were finished
        await asyncio.sleep(PURGE_WAIT)


#: seconds a stale MySQL/MariaDB database is left for InnoDB's purge (see stale_groups)
PURGE_WAIT = 15.0


async def drain(db: str, tmp: str, n: int, groups: int, capacity: int = 10,
                concurrency: int | None = None, stale: int = 0, vacuum: bool = True,
                group_cap: int | None = None, rate: int | None = None,
                default_cap: int | None = None, group_rate: int | None = None) -> float:
    """One fresh database: set up, drain, verify; jobs/s of the drain. ``group_cap``: every
    group capped at that (group_limits); ``rate``: a RateLimit(rate, per=1);
    ``default_cap`` / ``group_rate``: the stored ``"*"`` row's cap / RateLimit(n, per=1)
    (every group without a row of its own: issue 31)."""
    from sqlalchemy import func, select

    from aiojobqueue import JobQueue, RateLimit
    from aiojobqueue import schema as S

    url, prefix = url_for(db, tmp), f"bf{uuid.uuid4().hex[:8]}_"
    q = JobQueue(url, prefix=prefix, capacity=capacity, concurrency=concurrency,
                 group_limits={f"g{i:06d}": group_cap for i in range(groups)} if group_cap
                 else None, limits=[RateLimit(rate, per=1.0)] if rate else ())

    @q.handler("noop")
    async def noop(ctx: Any) -> None:
        return None

    try:
        if default_cap is not None or group_rate is not None:
            # stored before the worker starts (as a deployment's policy is): a change
            # while it serves turns the hand-over off for a moment (docs/scheduling.md)
            async with JobQueue(url, prefix=prefix) as admin:
                if default_cap is not None:
                    await admin.set_group("*", cap=default_cap)
                if group_rate is not None:
                    await admin.set_group("*", rate=RateLimit(group_rate, per=1.0))
        async with q:
            if stale:
                await stale_groups(q, stale, vacuum)
            await enqueue(q, n, groups)
            t0 = time.perf_counter()
            await q.run_until_idle()
            dt = time.perf_counter() - t0
            J = q._started().db.t.jobs

            async def count(conn: Any) -> int:
                return int((await conn.execute(select(func.count()).select_from(J).where(
                    J.c.state == S.DONE, J.c.group_key.like("g%")))).scalar_one())

            done = await q._read(count)
            if done != n:
                raise SystemExit(f"{db}: drain incomplete: {done}/{n} done")
    finally:
        await drop(url, prefix)
    return n / dt


def turnover(db: str, tmp: str, jobs: int, conc: int = 8, ms: int = 50
             ) -> tuple[float, float, float, int]:
    """(busy share of the ``conc`` slots, end-to-next-start median and p99 in ms, max
    overlap) of ``jobs`` jobs of ``ms`` ms drained by 3 worker processes."""
    sys.path.insert(0, str(ROOT / "tests"))
    import schedtools as T

    from aiojobqueue import JobQueue

    url, prefix = url_for(db, tmp), f"bt{uuid.uuid4().hex[:8]}_"
    log = Path(tmp) / f"{prefix}.log"

    async def setup(enq: bool) -> None:
        q = JobQueue(url, prefix=prefix)
        async with q:
            if enq:
                b = q.batch()
                for _ in range(jobs):
                    b.add("work", {"ms": ms})
                await b.commit()

    asyncio.run(setup(False))  # the tables, before the workers race to make them
    procs = [T.spawn(url, prefix, log, "--concurrency", str(conc)) for _ in range(3)]
    try:
        T.wait_ready(procs)
        asyncio.run(setup(True))
        deadline = time.monotonic() + 120
        while len(T.read_log(log)) < jobs and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        T.stop(procs)
        asyncio.run(drop(url, prefix))
    rows = T.read_log(log)
    if len(rows) < jobs:
        raise SystemExit(f"{db}: turnover drain incomplete: {len(rows)}/{jobs}")
    t0, t1 = min(r["start"] for r in rows), max(r["end"] for r in rows)
    busy = sum(r["end"] - r["start"] for r in rows) / (conc * (t1 - t0))
    # each end frees a slot: the first start after it not yet matched to an earlier end
    starts = sorted(r["start"] for r in rows)[conc:]  # the first conc took empty slots
    ends = sorted(r["end"] for r in rows)
    gaps, i = [], 0
    for e in ends:
        while i < len(starts) and starts[i] < e:
            i += 1  # a start before this end used another slot
        if i == len(starts):
            break
        gaps.append(starts[i] - e)
        i += 1
    gaps.sort()
    med = gaps[len(gaps) // 2] * 1e3 if gaps else 0.0
    p99 = gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))] * 1e3 if gaps else 0.0
    return busy, med, p99, T.max_overlap(rows)


PEERS = "/work/shared/bench-peers"


async def drain_pgqueuer(n: int, capped: bool) -> float:
    """PgQueuer's drain of ``n`` no-op jobs in a fresh database: jobs/s from the first
    handler start to the last end."""
    import asyncpg

    sys.path.insert(0, PEERS)
    import peer_pgqueuer as P
    from common import Recorder

    name = f"fairpgq_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect("postgresql://postgres@127.0.0.1:5432/test")
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        dsn = f"postgresql://postgres@127.0.0.1:5432/{name}"
        await P.install(dsn)
        await P.enqueue_batch(dsn, n, 1000)
        rec = Recorder()
        params = P.run_params(10) if capped else {"batch_size": 10, "max_concurrent_tasks": None}
        await P.work(dsn, 10, True, rec, asyncio.Event(), params=params)
        v = await P.verify(dsn, n)
        if v["completed"] != n or rec.dups:
            raise SystemExit(f"pgqueuer drain incomplete: {v}")
        return n / (rec.last_end - rec.first_start)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def amain(args: argparse.Namespace) -> None:
    only = set(args.only.split(","))
    groups = [int(g) for g in args.groups.split(",")]
    caps = [int(c) for c in args.caps.split(",")]
    print(f"# N={args.n} per drain, reps={args.reps}, load avg {os.getloadavg()[0]:.1f}")
    print("| db | workload | jobs/s | vs | ratio |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for db in args.dbs.split(","):
            rows: dict[str, list[float]] = {}

            def note(k: str, v: float, rows: dict[str, list[float]] = rows) -> None:
                rows.setdefault(k, []).append(v)

            for _ in range(args.reps):
                if "peer" in only and db == "postgresql":
                    note("pgqueuer defaults", await drain_pgqueuer(args.n, False))
                    note("pgqueuer max_concurrent_tasks=10", await drain_pgqueuer(args.n, True))
                if "groups" in only:
                    for g in groups:
                        note(f"groups={g}", await drain(db, tmp, args.n, g))
                if "stale" in only:
                    note("fresh 10 groups", await drain(db, tmp, args.n, 10))
                    note(f"10 groups after {args.stale} stale",
                         await drain(db, tmp, args.n, 10, stale=args.stale))
                    if db == "postgresql":
                        note(f"10 groups after {args.stale} stale, not vacuumed",
                             await drain(db, tmp, args.n, 10, stale=args.stale, vacuum=False))
                if "cap" in only:
                    for c in caps:
                        note(f"capacity={c}", await drain(db, tmp, args.n, 1, capacity=c))
                        note(f"capacity={c} concurrency={c}",
                             await drain(db, tmp, args.n, 1, capacity=c, concurrency=c))
                        note(f"capacity={c} group_limits={c}",
                             await drain(db, tmp, args.n, 1, capacity=c, group_cap=c))
                        note(f"capacity={c} RateLimit(10**6)",
                             await drain(db, tmp, args.n, 1, capacity=c, rate=10**6))
            med = {k: statistics.median(v) for k, v in rows.items()}

            def line(k: str, base: str | None, med: dict[str, float] = med,
                     db: str = db) -> None:
                if k not in med:
                    return
                r = f"{med[k] / med[base]:.2f}" if base and base in med else ""
                print(f"| {db} | {k} | {med[k]:,.0f} | {base or ''} | {r} |", flush=True)

            for g in groups:
                line(f"groups={g}", f"groups={groups[0]}")
            peer = max(("pgqueuer defaults", "pgqueuer max_concurrent_tasks=10"),
                       key=lambda k: med.get(k, 0.0))
            if peer in med:
                line("pgqueuer defaults", None)
                line("pgqueuer max_concurrent_tasks=10", None)
                for g in groups:
                    line(f"groups={g}", peer)
            line("fresh 10 groups", None)
            line(f"10 groups after {args.stale} stale", "fresh 10 groups")
            line(f"10 groups after {args.stale} stale, not vacuumed", "fresh 10 groups")
            for c in caps:
                line(f"capacity={c}", None)
                line(f"capacity={c} concurrency={c}", f"capacity={c}")
                line(f"capacity={c} group_limits={c}", f"capacity={c}")
                line(f"capacity={c} RateLimit(10**6)", f"capacity={c}")
            if "turnover" in only:
                busy, med, p99, peak = await asyncio.to_thread(
                    turnover, db, tmp, args.turn_jobs)
                print(f"| {db} | turnover: {args.turn_jobs} x 50 ms, concurrency=8, 3 procs | "
                      f"busy {busy:.1%} | end-to-next-start p50 {med:.1f} ms, p99 {p99:.1f} ms"
                      f" | max running {peak} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dbs", default="postgresql,sqlite,mariadb")
    p.add_argument("--n", type=int, default=3000)
    p.add_argument("--groups", default="1,10,100,1000")
    p.add_argument("--stale", type=int, default=10000)
    p.add_argument("--caps", default="10,50")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--turn-jobs", type=int, default=480)
    p.add_argument("--only", default="peer,groups,stale,cap,turnover")
    asyncio.run(amain(p.parse_args()))


if __name__ == "__main__":
    main()

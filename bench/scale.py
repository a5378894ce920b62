"""Scale-out: one total concurrency spread over 1, 2, 4 and 8 worker processes.

    /work/venv/bin/python bench/scale.py [--jobs 4000] [--concurrency 64] [--ms 10]
        [--procs 1,2,4,8] [--dbs postgresql,pgbouncer,mariadb] [--gate] [--pool 4]

A database name may carry a driver: ``pgbouncer+psycopg`` (``postgresql+psycopg://``
through PgBouncer), ``postgresql+psycopg`` (directly); without one PostgreSQL runs on asyncpg.

For each database and process count P: P worker processes of capacity C/P (``serve()``,
the defaults a user gets except ``poll_interval=0.2``), idle and ready; then one batch of
``--jobs`` jobs (each sleeps ``--ms``) in one transaction, and the drain timed from the
database's own clock: the rate is the middle 80% of jobs over the time between the 10th and
90th percentile of ``finished_at`` (start-up and tail excluded). Claim latency: each worker
times its claim calls (``Claimer.claim``: the claim's statements in its transaction).
``--gate`` adds a global ``concurrency=C`` cap, so every claim also takes the gate row.

Databases: PostgreSQL at 127.0.0.1:5432 (``postgres``, db ``test``) directly, through a
PgBouncer this script starts (transaction pooling, ``default_pool_size`` ``--pool``: 4
unless given, tests/pgbouncer.py; workers get ``listen_url`` to the server), and MariaDB at
127.0.0.1:3306 (root, db ``test``). While a run drains, the server is sampled every 20 ms or
so: on PostgreSQL the wait events of the backends running this run's statements
(pg_stat_activity, matched by table prefix) and their ungranted locks (pg_locks); on MariaDB
the InnoDB transactions of this run in LOCK WAIT (information_schema.INNODB_TRX) and the
growth of Innodb_row_lock_waits (SHOW GLOBAL STATUS; the server is shared, so that one
counts other clients too).

One table: rate, rate against P=1 on the same database, through PgBouncer against direct at
the same P, claim p50/p99, the workers' CPU per job, the server's commits per job, and the
top wait events (share of active samples).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

PG = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
MY = "mysql+aiomysql://root@127.0.0.1:3306/test"


# -- a worker process ----------------------------------------------------------------------
async def worker_main(url: str, prefix: str, capacity: int, ms: int, gate: int,
                      listen_url: str) -> None:
    from aiojobqueue import JobContext, JobQueue
    from aiojobqueue.claim import Claimer
    from aiojobqueue.runner import run_worker

    took: list[float] = []
    real = Claimer.claim

    async def timed(self: Claimer, *a: Any, **kw: Any) -> Any:  # one claim transaction's call
        t = time.perf_counter()
        try:
            return await real(self, *a, **kw)
        finally:
            took.append(time.perf_counter() - t)

    Claimer.claim = timed  # type: ignore[method-assign]

    q = JobQueue(url, prefix=prefix, capacity=capacity, concurrency=gate or None,
                 poll_interval=0.2, listen_url=listen_url or None)

    @q.handler("work")
    async def work(ctx: JobContext, ms: int) -> None:
        await asyncio.sleep(ms / 1000)

    async with q:
        print("ready", flush=True)
        cpu0 = time.process_time()
        await run_worker(q)
    print(json.dumps({"claims": took, "cpu": time.process_time() - cpu0}), flush=True)


# -- the coordinator -----------------------------------------------------------------------
def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


class Sampler:
    """Server-side contention while a run drains (see the module docstring)."""

    def __init__(self, db: str, prefix: str) -> None:
        self.db, self.prefix = db, prefix
        self.waits: Counter[str] = Counter()
        self.active = 0
        self.samples = 0
        self.lock_waits = 0
        self.row_lock_waits = 0
        self.commits = 0

    async def run(self, stop: asyncio.Event) -> None:
        from sqlalchemy import text
        from sqlalchemy.ext.asyncio import create_async_engine
        from sqlalchemy.pool import NullPool

        pg = self.db != "mariadb"
        engine = create_async_engine(PG if pg else MY, poolclass=NullPool)
        like = f"%{self.prefix}%"
        try:
            async with engine.connect() as conn:
                conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
                before = None if pg else await self._row_lock_waits(conn)
                commits0 = await self._commits(conn, pg)
                while not stop.is_set():
                    self.samples += 1
                    if pg:
                        rows = (await conn.execute(text(
                            "SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU'), "
                            "count(*) FROM pg_stat_activity WHERE state = 'active' "
                            "AND query LIKE :p AND pid <> pg_backend_pid() GROUP BY 1"),
                            {"p": like})).all()
                        self.lock_waits += (await conn.execute(text(
                            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a "
                            "USING (pid) WHERE NOT l.granted AND a.query LIKE :p"),
                            {"p": like})).scalar_one()
                    else:
                        rows = (await conn.execute(text(
                            "SELECT coalesce(nullif(STATE, ''), COMMAND), count(*) FROM "
                            "information_schema.PROCESSLIST WHERE INFO LIKE :p "
                            "AND ID <> CONNECTION_ID() GROUP BY 1"), {"p": like})).all()
                        self.lock_waits += (await conn.execute(text(
                            "SELECT count(*) FROM information_schema.INNODB_TRX WHERE "
                            "trx_state = 'LOCK WAIT' AND trx_query LIKE :p"),
                            {"p": like})).scalar_one()
                    for what, n in rows:
                        self.waits[str(what)] += int(n)
                        self.active += int(n)
                    try:
                        async with asyncio.timeout(0.02):
                            await stop.wait()
                    except TimeoutError:
                        pass
                if before is not None:
                    self.row_lock_waits = await self._row_lock_waits(conn) - before
                self.commits = await self._commits(conn, pg) - commits0
        finally:
            await engine.dispose()

    @staticmethod
    async def _commits(conn: Any, pg: bool) -> int:
        """Transactions committed on the server so far (server-wide: other clients too)."""
        from sqlalchemy import text

        if pg:
            return int((await conn.execute(text(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = 'test'"))).scalar_one())
        row = (await conn.execute(text("SHOW GLOBAL STATUS LIKE 'Handler_commit'"))).one()
        return int(row[1])

    @staticmethod
    async def _row_lock_waits(conn: Any) -> int:
        from sqlalchemy import text

        row = (await conn.execute(text("SHOW GLOBAL STATUS LIKE 'Innodb_row_lock_waits'"))).one()
        return int(row[1])

    def top(self, n: int = 3) -> str:
        if not self.active:
            return "-"
        parts = [f"{w} {100 * c / self.active:.0f}%" for w, c in self.waits.most_common(n)]
        return ", ".join(parts)


def bouncer_stats(bouncer: Any) -> dict[str, int]:
    """PgBouncer's SHOW STATS totals for the database ``test`` (queries, transactions, and
    microseconds: in transactions, in queries, clients waiting for a server connection)."""
    if bouncer is None:
        return {}
    row = next(r for r in bouncer.admin("SHOW STATS") if r["database"] == "test")
    return {k: int(row[f"total_{k}"]) for k in
            ("query_count", "xact_count", "xact_time", "query_time", "wait_time")}


async def one_run(db: str, url: str, procs: int, args: argparse.Namespace,
                  listen_url: str = "", bouncer: Any = None) -> dict[str, Any]:
    from sqlalchemy import func, select

    from aiojobqueue import JobQueue

    prefix = f"s{uuid.uuid4().hex[:8]}_"
    setup = MY if db == "mariadb" else PG
    admin = JobQueue(setup, prefix=prefix)
    cap = args.concurrency // procs
    workers: list[asyncio.subprocess.Process] = []
    async with admin:
        try:
            for _ in range(procs):
                workers.append(await asyncio.create_subprocess_exec(
                    sys.executable, __file__, "--worker", url, prefix, str(cap), str(args.ms),
                    str(args.concurrency if args.gate else 0), listen_url,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE))
            for w in workers:
                assert w.stdout is not None and w.stderr is not None
                line = (await w.stdout.readline()).decode()
                if line.strip() != "ready":
                    err = (await w.stderr.read()).decode()
                    raise RuntimeError(f"worker did not start: {line}{err}")
            stop = asyncio.Event()
            sampler = Sampler(db, prefix)
            sampling = asyncio.create_task(sampler.run(stop))
            pb0 = bouncer_stats(bouncer)
            async with admin.batch() as b:
                for _ in range(args.jobs):
                    b.add("work", {"ms": args.ms})
            J = admin._t.jobs
            deadline = time.monotonic() + 600
            while True:
                left = await admin._read(lambda c: c.scalar(
                    select(func.count()).select_from(J).where(J.c.finished_at.is_(None))))
                if not left:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{left} jobs left after 600 s")
                await asyncio.sleep(0.1)
            pb = {k: v - pb0[k] for k, v in bouncer_stats(bouncer).items()}
            stop.set()
            await sampling
            fins = sorted(r[0] for r in await admin._read(lambda c: c.execute(
                select(J.c.finished_at))))
        finally:
            for w in workers:
                w.send_signal(signal.SIGTERM)
            claims: list[float] = []
            cpu = 0.0
            for w in workers:
                out, _ = await asyncio.wait_for(w.communicate(), 60)
                for line in out.decode().splitlines():
                    if line.startswith("{"):
                        got = json.loads(line)
                        claims += got["claims"]
                        cpu += got["cpu"]
        await admin.engine.dispose()  # the tables go: an engine of its own for the drop
    await drop(setup, prefix)
    lo, hi = fins[len(fins) // 10], fins[len(fins) * 9 // 10]
    span = (hi - lo).total_seconds()
    rate = (len(fins) * 8 // 10) / span if span > 0 else float("nan")
    return {"db": db, "procs": procs, "cap": cap, "rate": rate,
            "p50": pct(claims, 0.5) * 1000, "p99": pct(claims, 0.99) * 1000,
            "claims": len(claims), "top": sampler.top(), "lock_waits": sampler.lock_waits,
            "samples": sampler.samples, "row_lock_waits": sampler.row_lock_waits,
            "cpu_ms": 1000 * cpu / args.jobs, "commits": sampler.commits / args.jobs,
            "pb": pb}


async def drop(url: str, prefix: str) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    from aiojobqueue.schema import build_tables

    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(build_tables(prefix).metadata.drop_all)
    finally:
        await engine.dispose()


async def main(args: argparse.Namespace) -> None:
    from pgbouncer import PgBouncer

    procs = [int(p) for p in args.procs.split(",")]
    dbs = args.dbs.split(",")
    bouncer = None
    if any(d.startswith("pgbouncer") for d in dbs):
        bouncer = PgBouncer(PG, pool_size=args.pool)
        bouncer.start()
    results: list[dict[str, Any]] = []
    try:
        for db in dbs:
            base, _, driver = db.partition("+")  # "pgbouncer+psycopg": that driver
            url = {"postgresql": PG, "mariadb": MY}.get(base) or (bouncer.url if bouncer else "")
            if driver:
                url = url.replace("+asyncpg", "+" + driver)
            for p in procs:
                pooled = base == "pgbouncer"
                r = await one_run(db, url, p, args, PG if pooled else "",
                                  bouncer if pooled else None)
                results.append(r)
                print(f"  {db} x{p}: {r['rate']:.0f} jobs/s", file=sys.stderr, flush=True)
    finally:
        if bouncer is not None:
            bouncer.stop()
    base = {r["db"]: r["rate"] for r in results if r["procs"] == procs[0]}
    direct = {r["procs"]: r["rate"] for r in results if r["db"] == "postgresql"}
    print(f"\ntotal concurrency {args.concurrency}, {args.jobs} jobs of {args.ms} ms, "
          f"{'global cap ' + str(args.concurrency) if args.gate else 'no global cap'}, "
          f"PgBouncer default_pool_size {args.pool}, "
          f"{os.cpu_count()} CPUs")
    head = (f"{'database':<17} {'procs':>5} {'cap':>4} {'jobs/s':>7} {'vs x1':>6} "
            f"{'vs direct':>9} {'claim p50':>9} {'p99':>7} {'cpu/job':>7} {'commits/job':>11} "
            f"{'lock waits':>10}  top server states")
    print(head)
    print("-" * len(head))
    for r in results:
        vs1 = r["rate"] / base[r["db"]]
        vsd = (f"{r['rate'] / direct[r['procs']]:.2f}"
               if r["db"].startswith("pgbouncer") and r["procs"] in direct else "")
        waits = f"{r['lock_waits']}/{r['samples']}"
        if r["db"] == "mariadb":
            waits += f" +{r['row_lock_waits']}"
        print(f"{r['db']:<17} {r['procs']:>5} {r['cap']:>4} {r['rate']:>7.0f} {vs1:>6.2f} "
              f"{vsd:>9} {r['p50']:>7.1f}ms {r['p99']:>5.1f}ms {r['cpu_ms']:>5.2f}ms "
              f"{r['commits']:>11.2f} {waits:>10}  {r['top']}")
    print("cpu/job: CPU of all worker processes per job; commits/job: transactions the server "
          "committed per job (server-wide: other clients count too);\nlock waits: ungranted "
          "locks (PostgreSQL) / transactions in LOCK WAIT (MariaDB) summed over samples / "
          "samples; MariaDB +N: growth of Innodb_row_lock_waits")
    pooled = [r for r in results if r["pb"]]
    if pooled:
        print("\nPgBouncer's own SHOW STATS over each drain (database test):")
        head = (f"{'database':<17} {'procs':>5} {'xacts/job':>9} {'queries/job':>11} "
                f"{'us/xact':>8} {'us/query':>8} {'query share':>11} {'client wait/job':>15}")
        print(head)
        print("-" * len(head))
        for r in pooled:
            pb, n = r["pb"], args.jobs
            xacts, queries = max(pb["xact_count"], 1), max(pb["query_count"], 1)
            print(f"{r['db']:<17} {r['procs']:>5} {pb['xact_count'] / n:>9.2f} "
                  f"{pb['query_count'] / n:>11.2f} {pb['xact_time'] / xacts:>8.0f} "
                  f"{pb['query_time'] / queries:>8.0f} "
                  f"{pb['query_time'] / max(pb['xact_time'], 1):>11.2f} "
                  f"{pb['wait_time'] / n / 1000:>13.2f}ms")
        print("us/xact: a transaction's time on a server connection; query share: of it, the "
              "time the server spent on queries (the rest: waiting on the client between "
              "them); client wait: clients queueing for a server connection")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        a = sys.argv[2:]
        asyncio.run(worker_main(a[0], a[1], int(a[2]), int(a[3]), int(a[4]),
                                a[5] if len(a) > 5 else ""))
        sys.exit(0)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=4000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--ms", type=int, default=10)
    ap.add_argument("--procs", default="1,2,4,8")
    ap.add_argument("--dbs", default="postgresql,pgbouncer,mariadb")
    ap.add_argument("--gate", action="store_true")
    ap.add_argument("--pool", type=int, default=4,
                    help="PgBouncer's default_pool_size (server connections shared by all)")
    asyncio.run(main(ap.parse_args()))

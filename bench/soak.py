"""Health under a steady load: does the table stay small and the claim fast for hours?

    .venv/bin/python bench/soak.py postgresql|mariadb|sqlite [--minutes 60] [--every 300]
        [--rate 500] [--workers 2] [--capacity 32] [--retention 300] [--sweep-every 30]

Offers a steady rate: ``--rate`` plain jobs a second (each sleeps 1-10 ms, 20 tenants as
groups, enqueued in 10 slices a second) plus one DAG a second (a container of four chained
jobs and a job after it), to ``--workers`` worker processes (``serve()``) with retention on
(``--retention`` seconds for done, failed and cancelled; the sweep every ``--sweep-every``
seconds) and the database's own maintenance as configured (PostgreSQL: autovacuum as the
server has it; with ``--vacuum-every S`` this script VACUUMs the jobs table every S seconds
instead, for a server whose autovacuum is off, as on the shared test machine). Every
``--every`` seconds it prints one row:
jobs finished in the period and the rate, the jobs table's size and its indexes' (PostgreSQL:
pg_relation_size / pg_indexes_size; MariaDB: information_schema.TABLES after ANALYZE TABLE;
SQLite: the file), rows in the table, dead tuples (PostgreSQL n_dead_tup) or the InnoDB
history list length (MariaDB), WAL bytes per finished job (PostgreSQL), claim p50/p99 (each
``Claimer.claim`` call, in the workers) and wake latency p50/p99 (enqueue to handler start,
wall clocks of one machine).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

URLS = {
    "postgresql": os.environ.get("AIOJOBQUEUE_TEST_PG",
                                 "postgresql+asyncpg://postgres@127.0.0.1:5432/test"),
    "mariadb": os.environ.get("AIOJOBQUEUE_TEST_MYSQL", "mysql+aiomysql://root@127.0.0.1:3306/test"),
}


# -- a worker process ----------------------------------------------------------------------
async def worker_main(url: str, prefix: str, capacity: int, out: str, every: float,
                      retain: float, sweep_every: float) -> None:
    from aiojobqueue import JobContext, JobQueue, retention
    from aiojobqueue.claim import Claimer
    from aiojobqueue.runner import run_worker

    retention.EVERY = sweep_every
    claims: list[float] = []
    wakes: list[float] = []
    done = [0]
    real = Claimer.claim

    async def timed(self: Claimer, *a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return await real(self, *a, **kw)
        finally:
            claims.append(time.perf_counter() - t)

    Claimer.claim = timed  # type: ignore[method-assign]
    q = JobQueue(url, prefix=prefix, capacity=capacity, poll_interval=0.5,
                 retention={s: retain for s in ("done", "failed", "cancelled")})

    @q.handler("work")
    async def work(ctx: JobContext, ms: int, t: float) -> None:
        wakes.append(time.time() - t)
        await asyncio.sleep(ms / 1000)
        done[0] += 1

    async def report() -> None:
        with open(out, "a") as f:  # noqa: ASYNC230 - a bench's own log
            while True:
                # well within the coordinator's period, so each of its rows has the records
                # of its own minutes (at most 5 s of them late)
                await asyncio.sleep(min(every / 4, 5.0))
                rec = {"t": time.time(), "claims": claims[:], "wakes": wakes[:], "done": done[0]}
                claims.clear()
                wakes.clear()
                f.write(json.dumps(rec) + "\n")
                f.flush()

    async with q:
        print("ready", flush=True)
        task = asyncio.create_task(report())
        try:
            await run_worker(q)
        finally:
            task.cancel()


# -- the coordinator -----------------------------------------------------------------------
def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


async def produce(q: Any, rate: int, stop: asyncio.Event) -> None:
    """``rate`` jobs a second in ten slices, and a DAG a second."""
    tick, n = 0, 0
    t0 = time.monotonic()
    while not stop.is_set():
        async with q.batch() as b:
            for _ in range(rate // 10):
                b.add("work", {"ms": random.randint(1, 10), "t": time.time()},
                      group=f"tenant{n % 20}")
                n += 1
        if tick % 10 == 0:
            async with q.batch() as b:
                box = b.container("dag", group=f"tenant{tick % 20}")
                prev = None
                for _ in range(4):
                    prev = b.add("work", {"ms": 2, "t": time.time()}, parent=box,
                                 depends_on=[prev] if prev else [])
                b.add("work", {"ms": 2, "t": time.time()}, depends_on=[box],
                      group=f"tenant{tick % 20}")
        tick += 1
        await asyncio.sleep(max(0.0, t0 + tick / 10 - time.monotonic()))


async def health(engine: Any, db: str, prefix: str, path: str | None) -> dict[str, Any]:
    """Sizes, rows, dead tuples / history length, WAL position."""
    from sqlalchemy import text

    J = f"{prefix}jobs"
    out: dict[str, Any] = {}
    async with engine.connect() as c:
        c = await c.execution_options(isolation_level="AUTOCOMMIT")
        out["rows"] = (await c.execute(text(f"SELECT count(*) FROM {J}"))).scalar()
        if db == "postgresql":
            r = (await c.execute(text(
                f"SELECT pg_relation_size('{J}'), pg_indexes_size('{J}'), s.n_dead_tup, "
                "pg_current_wal_lsn() - '0/0', s.n_tup_upd + s.n_tup_del, "
                "s.autovacuum_count + s.vacuum_count "
                f"FROM pg_stat_user_tables s WHERE s.relname = '{J}'"))).one()
            out.update(table=r[0], indexes=r[1], dead=r[2], wal=int(r[3]), made=r[4],
                       vacuums=r[5])
        elif db == "mariadb":
            await c.execute(text(f"ANALYZE TABLE {J}"))
            r = (await c.execute(text(
                "SELECT data_length, index_length FROM information_schema.TABLES "
                f"WHERE table_schema = DATABASE() AND table_name = '{J}'"))).one()
            st = dict((await c.execute(text(
                "SHOW GLOBAL STATUS WHERE Variable_name IN "
                "('Innodb_history_list_length', 'Innodb_lsn_current')"))).all())
            # the undo history InnoDB has yet to purge, and the redo log's position (the
            # server's: this script assumes nothing else writes to it meanwhile)
            out.update(table=r[0], indexes=r[1], dead=int(st["Innodb_history_list_length"]),
                       wal=int(st["Innodb_lsn_current"]), made=None, vacuums=None)
        else:
            size = os.path.getsize(path) if path else None  # noqa: ASYNC240
            out.update(table=size, indexes=None, dead=None, wal=None, made=None, vacuums=None)
    return out


async def vacuuming(engine: Any, prefix: str, every: float) -> None:
    """What autovacuum would do for the jobs table, where the server has it off."""
    from sqlalchemy import text

    while True:
        await asyncio.sleep(every)
        async with engine.connect() as c:
            c = await c.execution_options(isolation_level="AUTOCOMMIT")
            await c.execute(text(f"VACUUM {prefix}jobs"))


def summarize(periods: list[dict[str, Any]], every: float) -> None:
    """The bars: sizes after the first ten minutes within +-20% of their value then; claim
    p99 of the last ten minutes against the first ten; WAL (redo) bytes and dead tuples per
    job over the whole run. A period is stamped with the minute its row was printed, a
    little after its end (10.003): the windows take the periods ending within half a period
    of their bounds."""
    if not periods or periods[-1]["min"] < 20:
        return
    half = every / 120
    base = min((p for p in periods if p["min"] >= 10 - half), key=lambda p: p["min"])
    later = [p for p in periods if p["min"] > base["min"]]
    for k in ("table", "indexes"):
        if base[k]:
            lo = min(p[k] for p in later) / base[k]
            hi = max(p[k] for p in later) / base[k]
            print(f"# {k} after minute {base['min']:.0f}: {lo:.2f}-{hi:.2f}x its size then "
                  f"({mb(base[k])} MB)")
    end = periods[-1]["min"]
    first = [c for p in periods if p["min"] <= 10 + half for c in p["claims"]]
    last = [c for p in periods if p["min"] > end - 10 + half for c in p["claims"]]
    if first and last:
        print(f"# claim p99: first ten minutes {pct(first, 0.99) * 1000:.2f} ms, last ten "
              f"{pct(last, 0.99) * 1000:.2f} ms: {pct(last, 0.99) / pct(first, 0.99):.2f}x")
    for k, what in (("wal", "WAL (redo) bytes"), ("made", "dead tuples made")):
        xs = [p[k] for p in periods if p[k] is not None]
        if xs:
            print(f"# {what} per job: median {pct(xs, 0.5):.2f} over the periods")
    print(f"# jobs/s: median {pct([p['rate'] for p in periods], 0.5):.0f}")


def mb(v: Any) -> str:
    return "-" if v is None else f"{v / 1e6:.1f}"


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("db", choices=["postgresql", "mariadb", "sqlite"])
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--every", type=float, default=300)
    ap.add_argument("--rate", type=int, default=500)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--capacity", type=int, default=32)
    ap.add_argument("--retention", type=float, default=300)
    ap.add_argument("--sweep-every", type=float, default=30)
    ap.add_argument("--vacuum-every", type=float, default=0,
                    help="PostgreSQL: VACUUM the jobs table this often (seconds), for a "
                         "server whose autovacuum is off; 0: never")
    a = ap.parse_args()
    from sqlalchemy.ext.asyncio import create_async_engine

    from aiojobqueue import JobQueue

    path = None
    url = URLS.get(a.db)
    if url is None:
        path = f"{tempfile.mkdtemp()}/soak.db"
        url = f"sqlite+aiosqlite:///{path}"
    prefix = f"soak{uuid.uuid4().hex[:6]}_"
    tmp = Path(tempfile.mkdtemp())
    q = JobQueue(url, prefix=prefix)
    await q.start()
    procs = []
    for i in range(a.workers):
        p = subprocess.Popen(  # noqa: ASYNC220 - started once
            [sys.executable, __file__, "--worker", url, prefix, str(a.capacity),
             str(tmp / f"w{i}.jsonl"), str(a.every), str(a.retention), str(a.sweep_every)],
            stdout=subprocess.PIPE, stderr=open(tmp / f"w{i}.log", "wb"))  # noqa: SIM115, ASYNC230
        procs.append(p)
    for p in procs:
        assert p.stdout is not None
        p.stdout.readline()
    engine = create_async_engine(url)
    stop = asyncio.Event()
    producer = asyncio.create_task(produce(q, a.rate, stop))
    vacuum = asyncio.create_task(vacuuming(engine, prefix, a.vacuum_every)) if (
        a.vacuum_every and a.db == "postgresql") else None
    print(f"# soak on {a.db}: {a.rate} jobs/s + a DAG/s, {a.workers} workers x {a.capacity}, "
          f"retention {a.retention:.0f}s, sweep every {a.sweep_every:.0f}s, "
          f"VACUUM every {a.vacuum_every:.0f}s (0: never), "
          f"load {os.getloadavg()[0]:.1f}; logs in {tmp}")
    print(f"{'min':>5} {'done':>7} {'jobs/s':>7} {'rows':>8} {'table MB':>9} {'idx MB':>7} "
          f"{'dead/hist':>9} {'dead/job':>8} {'vac':>3} {'WAL B/job':>9} {'claim p50':>9} "
          f"{'p99 ms':>7} {'wake p50':>8} {'p99 ms':>7} {'load':>5}", flush=True)
    t0 = time.time()
    ended = asyncio.Event()  # SIGTERM/SIGINT: print nothing more, clean up
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, ended.set)
    prev = await health(engine, a.db, prefix, path)
    seen = {i: 0 for i in range(a.workers)}
    done_prev = 0
    periods: list[dict[str, Any]] = []
    try:
        while time.time() - t0 < a.minutes * 60:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ended.wait(), a.every)
            if ended.is_set():
                break
            h = await health(engine, a.db, prefix, path)
            claims: list[float] = []
            wakes: list[float] = []
            done = 0
            for i in range(a.workers):
                lines = (tmp / f"w{i}.jsonl").read_text().splitlines() if (
                    tmp / f"w{i}.jsonl").exists() else []
                for line in lines[seen[i]:]:
                    rec = json.loads(line)
                    claims += rec["claims"]
                    wakes += rec["wakes"]
                seen[i] = len(lines)
                if lines:
                    done += json.loads(lines[-1])["done"]
            n = done - done_prev
            done_prev = done
            wal = (h["wal"] - prev["wal"]) / n if h["wal"] is not None and n else None
            made = (h["made"] - prev["made"]) / n if h["made"] is not None and n else None
            periods.append({"min": (time.time() - t0) / 60, "table": h["table"],
                            "indexes": h["indexes"], "claims": claims, "wal": wal,
                            "made": made, "rate": n / a.every})
            print(f"{(time.time() - t0) / 60:5.1f} {n:7d} {n / a.every:7.0f} {h['rows']:8d} "
                  f"{mb(h['table']):>9} {mb(h['indexes']):>7} "
                  f"{'-' if h['dead'] is None else h['dead']:>9} "
                  f"{'-' if made is None else f'{made:.2f}':>8} "
                  f"{'-' if h['vacuums'] is None else h['vacuums']:>3} "
                  f"{'-' if wal is None else f'{wal:.0f}':>9} "
                  f"{pct(claims, 0.5) * 1000:9.2f} {pct(claims, 0.99) * 1000:7.2f} "
                  f"{pct(wakes, 0.5) * 1000:8.1f} {pct(wakes, 0.99) * 1000:7.1f} "
                  f"{os.getloadavg()[0]:5.1f}", flush=True)
            prev = h
        summarize(periods, a.every)
    finally:
        stop.set()
        await producer
        if vacuum is not None:
            vacuum.cancel()
            await asyncio.gather(vacuum, return_exceptions=True)
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
        async with engine.begin() as conn:
            await conn.run_sync(q._t.metadata.drop_all)
        await engine.dispose()
        await q.close()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        u, pfx, cap, out, every, retain, sweep = sys.argv[2:9]
        asyncio.run(worker_main(u, pfx, int(cap), out, float(every), float(retain),
                                float(sweep)))
    else:
        asyncio.run(main())

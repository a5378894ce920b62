"""How many connections a worker process opens, counted on the server, and a fleet of 16
worker processes inside a connection budget the server enforces.

Each run connects as a role of its own, so the server's own view counts exactly its
connections: pg_stat_activity by user on PostgreSQL (through PgBouncer: the pooler's
clients by user, and the server connections it opened for that user), PROCESSLIST by user
on MariaDB; on SQLite, the worker's open descriptors of the database file. The budget is
the server's: a role ``CONNECTION LIMIT`` on PostgreSQL, ``MAX_USER_CONNECTIONS`` on
MariaDB, PgBouncer's ``default_pool_size`` (and the role's limit behind it).

What one worker process holds (pool_size=N, 5 by default, no overflow): PostgreSQL N + 1
(the LISTEN connection, to ``listen_url`` where given); MariaDB N + 1 (the bell's watch);
SQLite N + 3 (the side writer, up to 2, and the data_version watcher).

Run as a script, this file is that worker: ``python tests/dialects/test_connections.py URL PREFIX
CAPACITY POOL_SIZE [LISTEN_URL]`` (POOL_SIZE 0: the default).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

HERE = Path(__file__).resolve()
DEFAULT_POOL_SIZE = 5  # JobQueue's
JOBS_MS = 30


# -- the worker ----------------------------------------------------------------------------
async def _serve(url: str, prefix: str, capacity: int, pool_size: int,
                 listen_url: str | None) -> None:
    sys.path.insert(0, str(HERE.parents[2]))
    from aiojobqueue import JobContext, JobQueue
    from aiojobqueue.runner import run_worker

    q = JobQueue(url, prefix=prefix, capacity=capacity, pool_size=pool_size or DEFAULT_POOL_SIZE,
                 listen_url=listen_url, poll_interval=0.05, lease_ttl=4.0,
                 heartbeat_interval=0.5, shutdown_timeout=2.0)

    @q.handler("work")
    async def work(ctx: JobContext, ms: int, fan: int = 0) -> int:
        # the handler-side writes contend with the loop's for the pool
        await ctx.checkpoint({"at": "start"})
        await asyncio.sleep(ms / 1000)
        for _ in range(fan):
            await ctx.enqueue("work", {"ms": ms})
        return ctx.job_id

    async with q:
        print("ready", flush=True)
        await run_worker(q)


# -- counting --------------------------------------------------------------------------------
@dataclass
class Target:
    """One database as a role of its own: ``url`` for the workers, ``count()`` for the
    connections the server sees of that role (``client`` and ``server`` through PgBouncer)."""

    db: str
    url: str
    role: str
    listen_url: str | None = None
    bouncer: Any = None
    pids: list[int] = field(default_factory=list)

    async def count(self) -> dict[str, int]:
        from conftest import MY_URL, PG_URL
        from sqlalchemy import text
        from sqlalchemy.ext.asyncio import create_async_engine
        from sqlalchemy.pool import NullPool

        if self.db == "sqlite":
            path = self.url.split("///", 1)[1]
            n = 0
            for pid in self.pids:
                try:
                    fds = os.listdir(f"/proc/{pid}/fd")
                except FileNotFoundError:
                    continue
                for fd in fds:
                    with contextlib.suppress(OSError):  # closed meanwhile
                        n += os.readlink(f"/proc/{pid}/fd/{fd}") == path
            return {"server": n}
        admin = PG_URL if self.db in ("postgresql", "pgbouncer") else MY_URL
        sql = ("SELECT count(*) FROM pg_stat_activity WHERE usename = :r"
               if admin == PG_URL else
               "SELECT count(*) FROM information_schema.PROCESSLIST WHERE USER = :r")
        engine = create_async_engine(admin, poolclass=NullPool)
        try:
            async with engine.connect() as conn:
                got = (await conn.execute(text(sql), {"r": self.role})).scalar_one()
            out = {"server": int(got)}
        finally:
            await engine.dispose()
        if self.bouncer is not None:
            clients = await asyncio.to_thread(self.bouncer.admin, "SHOW CLIENTS")
            out["client"] = sum(1 for c in clients if c.get("user") == self.role)
        return out


async def _admin(url: str, *statements: str) -> None:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.pool import NullPool

    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            for s in statements:
                await conn.execute(text(s))
    finally:
        await engine.dispose()


@pytest_asyncio.fixture
async def target_factory(tmp_path: Path, prefix: str) -> AsyncIterator[Callable[..., Any]]:
    """``await make(db, limit, listen=False)`` -> a Target: a fresh role on ``db`` allowed
    ``limit`` connections (PgBouncer: its own pooler with ``limit`` server connections
    for the role); roles, tables and poolers go afterwards."""
    from conftest import MY_URL, PG_URL, drop_tables, server_url
    from pgbouncer import PgBouncer
    from sqlalchemy.engine import make_url

    made: list[Target] = []

    async def make(db: str, limit: int, listen: bool = False) -> Target:
        role = f"ajq_{uuid.uuid4().hex[:10]}"
        if db == "sqlite":
            t = Target(db, f"sqlite+aiosqlite:///{tmp_path}/jobs.db", role)
        elif db in ("postgresql", "pgbouncer"):
            server_url("postgresql")
            await _admin(PG_URL, f"CREATE ROLE {role} LOGIN CONNECTION LIMIT {limit}",
                         f"GRANT CREATE, USAGE ON SCHEMA public TO {role}")
            direct = make_url(PG_URL).set(username=role).render_as_string(hide_password=False)
            t = Target(db, direct, role, listen_url=direct if listen else None)
            if db == "pgbouncer":
                if PgBouncer.binary() is None:
                    pytest.skip("pgbouncer is not installed")
                t.bouncer = PgBouncer(PG_URL, pool_size=limit, users=("postgres", role))
                t.bouncer.start()
                t.url = t.bouncer.url.replace("postgres@", f"{role}@", 1)
        else:
            server_url("mariadb")
            await _admin(MY_URL, f"CREATE USER '{role}'@'%' WITH MAX_USER_CONNECTIONS {limit}",
                         f"GRANT ALL ON test.* TO '{role}'@'%'")
            t = Target(db, f"mysql+aiomysql://{role}@127.0.0.1:3306/test", role)
        made.append(t)
        return t

    yield make
    for t in made:
        if t.bouncer is not None:
            t.bouncer.stop()
        if t.db in ("postgresql", "pgbouncer"):
            await drop_tables(PG_URL, prefix)
            await _admin(PG_URL, f"DROP OWNED BY {t.role}", f"DROP ROLE {t.role}")
        elif t.db == "mariadb":
            await drop_tables(MY_URL, prefix)
            await _admin(MY_URL, f"DROP USER '{t.role}'@'%'")


class Workers:
    """Worker processes (this file as a script) on one Target."""

    def __init__(self, t: Target, prefix: str, tmp: Path) -> None:
        self.t, self.prefix, self.tmp = t, prefix, tmp
        self.procs: list[subprocess.Popen[str]] = []

    def spawn(self, capacity: int, pool_size: int) -> None:
        n = len(self.procs)
        log = open(self.tmp / f"w{n}.log", "w")  # noqa: SIM115 - lives with the process
        cmd = [sys.executable, str(HERE), self.t.url, self.prefix, str(capacity),
               str(pool_size)]
        if self.t.listen_url:
            cmd.append(self.t.listen_url)
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
        log.close()
        self.procs.append(p)
        self.t.pids.append(p.pid)

    async def ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        for i, p in enumerate(self.procs):
            while "ready" not in (self.tmp / f"w{i}.log").read_text():
                assert p.poll() is None, self.logs()
                assert time.monotonic() < deadline, self.logs()
                await asyncio.sleep(0.1)

    def logs(self) -> str:
        return "\n".join(f"--- w{i} ---\n" + (self.tmp / f"w{i}.log").read_text()
                         for i in range(len(self.procs)))

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


async def run_fleet(t: Target, prefix: str, tmp: Path, *, procs: int, capacity: int,
                    pool_size: int, jobs: int) -> tuple[dict[str, int], float, str]:
    """``jobs`` jobs (each checkpoints, a tenth enqueue another) on ``procs`` worker
    processes; the connection counts sampled every 50 ms while they run. Returns the peak of
    each count, the seconds it took and the workers' logs."""
    from conftest import MY_URL, PG_URL

    from aiojobqueue import JobQueue

    setup = {"postgresql": PG_URL, "pgbouncer": PG_URL, "mariadb": MY_URL}.get(t.db, t.url)
    producer = JobQueue(setup, prefix=prefix, pool_size=1)
    fleet = Workers(t, prefix, tmp)
    async with producer:  # creates the schema as the admin role; workers only use it
        if t.db in ("postgresql", "pgbouncer"):
            await _admin(PG_URL, f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {t.role}",
                         f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {t.role}")
        try:
            for _ in range(procs):
                fleet.spawn(capacity, pool_size)
            await fleet.ready()
            t0 = time.monotonic()
            async with producer.batch() as b:
                for i in range(jobs):
                    b.add("work", {"ms": JOBS_MS, "fan": int(i % 10 == 0)})
            total = jobs + (jobs + 9) // 10
            peak: dict[str, int] = {}
            J = producer._t.jobs
            while True:
                for k, v in (await t.count()).items():
                    peak[k] = max(peak.get(k, 0), v)
                done, left = await producer._read(lambda c: _counts(c, J))
                if done >= total and not left:  # (a re-run attempt may enqueue again)
                    break
                if time.monotonic() - t0 >= 120:  # say where the rest are, and why
                    rest = await producer._read(lambda c: _not_done(c, J))
                    raise AssertionError(f"{done}/{total} done; not done: {rest}\n"
                                         f"{fleet.logs()}")
                assert all(p.poll() is None for p in fleet.procs), fleet.logs()
                await asyncio.sleep(0.05)
            took = time.monotonic() - t0
        finally:
            fleet.stop()
    return peak, took, fleet.logs()


async def _not_done(conn: Any, J: Any) -> list[tuple[Any, ...]]:
    """(id, state, attempts, last error) of each job not done: why a drain did not end."""
    from sqlalchemy import select

    from aiojobqueue import JobState

    rows = await conn.execute(select(J.c.id, J.c.state, J.c.attempts, J.c.error)
                              .where(J.c.state != JobState.DONE).order_by(J.c.id).limit(20))
    return [tuple(r) for r in rows]


async def _counts(conn: Any, J: Any) -> tuple[int, int]:
    """(jobs done, jobs not done)."""
    from sqlalchemy import func, select

    from aiojobqueue import JobState

    rows = dict((await conn.execute(select(J.c.state, func.count()).group_by(J.c.state))).all())
    done = int(rows.pop(JobState.DONE, 0))
    return done, sum(int(n) for n in rows.values())


# -- the tests ---------------------------------------------------------------------------------
#: what one worker process may hold with pool_size=N: (pooled, on top of them) per database
EXTRA = {"sqlite": 3, "postgresql": 1, "pgbouncer": 1, "mariadb": 1}


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("pool_size", [2, 0])
async def test_one_worker_process_stays_within_its_stated_connections(
    db: str, pool_size: int, target_factory: Callable[..., Any], prefix: str, tmp_path: Path,
) -> None:
    """One worker, capacity 16, jobs that checkpoint and enqueue: with pool_size=2 the
    server sees at most 2 pooled connections plus the documented extras, with the default at
    most 5 plus them; and at least one: the count really sees the worker's."""
    t = await target_factory(db, limit=4 if db == "pgbouncer" else 40)
    peak, took, logs = await run_fleet(t, prefix, tmp_path, procs=1, capacity=16,
                                       pool_size=pool_size, jobs=300)
    bound = (pool_size or DEFAULT_POOL_SIZE) + EXTRA[db]
    print(f"\nCONNECTIONS {db} pool_size={pool_size or 'default'}: peak {peak} "
          f"(bound {bound}), 330 jobs in {took:.1f}s")
    assert 1 <= peak["server"] <= bound, peak
    if db == "pgbouncer":
        assert 1 <= peak["client"] <= bound, peak
        assert peak["server"] <= t.bouncer.pool_size, peak
    assert "Traceback" not in logs, logs[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("db", ["postgresql", "pgbouncer", "mariadb"])
async def test_sixteen_worker_processes_within_a_connection_budget(
    db: str, target_factory: Callable[..., Any], prefix: str, tmp_path: Path,
) -> None:
    """16 worker processes (capacity 4 each) drain 600 jobs inside a budget the server
    enforces: PostgreSQL direct, pool_size=1 each plus LISTEN: CONNECTION LIMIT 32;
    MariaDB pool_size=1 each plus the bell watch: MAX_USER_CONNECTIONS 32; through
    PgBouncer pool_size=2 each (32 clients, each with a listener until it finds
    notifications do not arrive) on 4 server connections (the role's CONNECTION LIMIT
    too). Past the budget a connection would fail ("too many connections"), and a worker
    log would say so."""
    procs = 16
    pool, limit = {"postgresql": (1, 32), "pgbouncer": (2, 4), "mariadb": (1, 32)}[db]
    t = await target_factory(db, limit=limit, listen=db == "postgresql")
    peak, took, logs = await run_fleet(t, prefix, tmp_path, procs=procs, capacity=4,
                                       pool_size=pool, jobs=600)
    print(f"\nFLEET {db}: {procs} processes, pool_size={pool}, budget {limit}: peak {peak}, "
          f"660 jobs in {took:.1f}s")
    assert peak["server"] <= limit, peak
    assert peak["server"] >= (limit // 2 if db != "pgbouncer" else 1), peak
    if db == "pgbouncer":
        # each worker's listener is a client too until its probe finds it deaf (5 s)
        assert peak["client"] <= procs * (pool + 1), peak
    for bad in ("Traceback", "too many connections", "ERROR"):
        assert bad not in logs, logs[-3000:]


if __name__ == "__main__":
    a = sys.argv[1:]
    asyncio.run(_serve(a[0], a[1], int(a[2]), int(a[3]), a[4] if len(a) > 4 else None))

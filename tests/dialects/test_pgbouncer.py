"""PostgreSQL through PgBouncer in transaction-pooling mode (tests/pgbouncer.py).

The semantics, enqueue and scheduling suites run through it too (their ``pgbouncer``
parameter, tests/conftest.py); here: that the pooler really shares server connections (and so
breaks what relies on session state), that the queue finds it and keeps no prepared
statement, ``listen_url``, the one warning when notifications do not arrive, and a chaos run
of worker processes SIGKILLed mid-DAG through it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from chaoskit import chaos, random_dag
from conftest import PG_URL, drop_tables
from crashkit import Fleet, fleet_factory  # noqa: F401 - fixture
from pgbouncer import PgBouncer
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool
from wakekit import QUICK, wake_time

from aiojobqueue import JobContext, JobQueue
from aiojobqueue.dialects.postgresql import POOLED_CONNECT_ARGS
from aiojobqueue.dialects.urls import connect_kwargs_for
from aiojobqueue.errors import ConfigurationError


@pytest_asyncio.fixture
async def tables(pgbouncer: PgBouncer) -> AsyncIterator[str]:
    """A fresh table prefix, its tables dropped afterwards (directly)."""
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    yield prefix
    await drop_tables(PG_URL, prefix)


async def test_pgbouncer_shares_server_connections_between_transactions(
    pgbouncer: PgBouncer,
) -> None:
    """The fixture is a real transaction pooler: eight clients each holding a transaction
    open are served by at most POOL_SIZE backends at a time (the others wait), and one client
    connection's transactions run on more than one backend, so session state cannot carry
    over."""
    engine = create_async_engine(pgbouncer.url, poolclass=NullPool,
                                 connect_args=POOLED_CONNECT_ARGS)
    try:
        held: set[int] = set()
        inside = 0
        most = 0

        async def client() -> None:
            nonlocal inside, most
            async with engine.begin() as conn:
                held.add((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())
                inside += 1
                most = max(most, inside)
                await asyncio.sleep(0.3)
                inside -= 1

        await asyncio.gather(*(client() for _ in range(8)))
        assert len(held) <= pgbouncer.pool_size
        assert most <= pgbouncer.pool_size

        pids: set[int] = set()
        async with engine.connect() as mine:
            raw = await mine.get_raw_connection()
            apg: Any = raw.driver_connection
            for _ in range(40):  # others keep the backends busy, so ours moves between them
                others = [asyncio.create_task(client()) for _ in range(3)]
                pids.add(await apg.fetchval("SELECT pg_backend_pid()"))
                await asyncio.gather(*others)
                if len(pids) > 1:
                    break
        assert len(pids) > 1, pids
    finally:
        await engine.dispose()


async def test_default_asyncpg_settings_break_behind_it(pgbouncer: PgBouncer) -> None:
    """What the queue avoids: SQLAlchemy's and asyncpg's statement caches keep named
    prepared statements, which another client's transaction on the same backend does not
    have (or already has under the same name)."""
    engines = [create_async_engine(pgbouncer.url) for _ in range(8)]
    errors: list[str] = []
    # Until the clients' transactions have landed on each other's backends (on a loaded
    # machine that can take more than a few rounds), within a deadline.
    deadline = asyncio.get_running_loop().time() + 30.0

    async def loop(engine: Any, i: int) -> None:
        n = 0
        while not errors and asyncio.get_running_loop().time() < deadline:
            n += 1
            try:
                async with engine.connect() as conn:
                    await conn.execute(text(f"SELECT {i} + :n"), {"n": n})
            except DBAPIError as exc:
                errors.append(str(exc.orig))

    try:
        await asyncio.gather(*(loop(e, i) for i, e in enumerate(engines)))
    finally:
        for e in engines:
            await e.dispose()
    assert any("prepared statement" in e for e in errors), errors[:3]


async def test_the_queue_finds_the_pooler_and_keeps_no_prepared_statement(
    pgbouncer: PgBouncer, tables: str,
) -> None:
    assert await connect_kwargs_for(make_url(PG_URL)) == {}
    assert await connect_kwargs_for(make_url(pgbouncer.url)) == POOLED_CONNECT_ARGS
    for url, cached in ((PG_URL, True), (pgbouncer.url, False)):
        async with JobQueue(url, prefix=tables, **QUICK) as q, q.engine.connect() as conn:
            raw = await conn.get_raw_connection()
            adapted: Any = raw.dbapi_connection
            apg: Any = raw.driver_connection
            assert (adapted._prepared_statement_cache is not None) is cached
            assert apg._stmt_cache_enabled is cached


async def test_a_caching_engine_behind_the_pooler_is_refused(
    pgbouncer: PgBouncer, tables: str,
) -> None:
    """A ready-made engine that keeps prepared statements would fail at random later: start
    says so at once, with the fix, and creates nothing."""
    engine = create_async_engine(pgbouncer.url, poolclass=NullPool)
    try:
        with pytest.raises(ConfigurationError, match="statement_cache_size"):
            async with JobQueue(engine, prefix=tables):
                pass
    finally:
        await engine.dispose()
    probe = create_async_engine(PG_URL)
    try:
        async with probe.connect() as conn:
            found = (await conn.execute(text("SELECT to_regclass(:t)"),
                                        {"t": f"{tables}jobs"})).scalar()
        assert found is None
    finally:
        await probe.dispose()
    # the same engine built with the settings is accepted
    good = create_async_engine(pgbouncer.url, connect_args=POOLED_CONNECT_ARGS)
    try:
        async with JobQueue(good, prefix=tables) as q:
            assert await q.enqueue("nobody") > 0
    finally:
        await good.dispose()


def test_listen_url_is_checked() -> None:
    with pytest.raises(ConfigurationError, match="PostgreSQL"):
        JobQueue("sqlite+aiosqlite:///x.db", listen_url=PG_URL)
    with pytest.raises(ConfigurationError, match="PostgreSQL"):
        JobQueue(PG_URL, listen_url="mysql://root@127.0.0.1/test")
    with pytest.raises(ConfigurationError, match="listen_url"):
        JobQueue(PG_URL, listen_url="not a url")
    assert JobQueue(PG_URL, listen_url="postgresql://postgres@h/db").settings.listen_url is not None


def test_pool_size_is_checked() -> None:
    """A pool_size that is not an int >= 1, or one given with a ready-made engine (whose
    pool the caller sized), is refused at construction."""
    for bad in (0, -1, True, 2.5, "5"):
        with pytest.raises(ConfigurationError, match="pool_size"):
            JobQueue("sqlite+aiosqlite:///x.db", pool_size=bad)  # type: ignore[arg-type]
    engine = create_async_engine(PG_URL)
    with pytest.raises(ConfigurationError, match="pool_size"):
        JobQueue(engine, pool_size=2)
    assert JobQueue(engine).pool_size == JobQueue("sqlite+aiosqlite:///x.db").pool_size == 5
    assert JobQueue(PG_URL, pool_size=2).settings.pool_size == 2


def _deaf_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "do not arrive" in r.getMessage()]


@pytest.mark.timeout(60)
async def test_listen_url_wakes_an_idle_worker_behind_the_pooler(
    pgbouncer: PgBouncer, tables: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "aiojobqueue")
    took = await wake_time(pgbouncer.url, tables, listen_url=PG_URL)
    assert took < 2.0, took
    assert not _deaf_warnings(caplog)


@pytest.mark.timeout(60)
async def test_without_listen_url_it_says_so_once_and_polls(
    pgbouncer: PgBouncer, tables: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """Through the pooler alone the NOTIFY never comes back: one warning naming
    listen_url, and an idle worker (30 s poll) is not woken by another's enqueue; with a
    short poll it still runs the job."""
    caplog.set_level(logging.WARNING, "aiojobqueue")
    took = await wake_time(pgbouncer.url, tables)
    assert took == float("inf"), took
    warned = _deaf_warnings(caplog)
    assert len(warned) == 1, [r.getMessage() for r in warned]
    assert "listen_url" in warned[0].getMessage()

    caplog.clear()
    q = JobQueue(pgbouncer.url, prefix=tables, **{**QUICK, "poll_interval": 0.2})

    @q.handler("ping")
    async def ping(ctx: JobContext) -> str:
        return "pong"

    other = JobQueue(pgbouncer.url, prefix=tables, **QUICK)
    async with q, other:
        task = asyncio.create_task(q.serve())
        try:
            await asyncio.sleep(6.5)
            jid = await other.enqueue("ping")
            assert await other.wait(jid, timeout=5.0) == "pong"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert len(_deaf_warnings(caplog)) == 1


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("db", ["pgbouncer"])
async def test_chaos_sigkill_workers_through_pgbouncer(
    make_queue: Callable[..., JobQueue], fleet_factory: Callable[..., Fleet],  # noqa: F811
    db: str,
) -> None:
    """test_chaos's run through PgBouncer (4 server connections for 3 worker processes and
    the test): workers SIGKILLed at random mid-DAG; nothing lost, one finalize per job,
    dependency order kept (checked from the database and the event log by chaos())."""
    rnd = random.Random(20261202)
    await chaos(make_queue, fleet_factory, db, rnd, random_dag(rnd), poll=0.05)

"""Shared fixtures: every database test runs on SQLite, PostgreSQL and MariaDB.

Each test gets its own table prefix, so tests never see each other's rows and the servers
need no per-test database. Server tests skip with a reason on a laptop without servers and
fail in CI (CI=true), where every database must be there.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy.ext.asyncio import create_async_engine

from aiojobqueue import JobQueue
from aiojobqueue.schema import build_tables

PG_URL = os.environ.get("AIOJOBQUEUE_TEST_PG", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
MY_URL = os.environ.get("AIOJOBQUEUE_TEST_MYSQL", "mysql+aiomysql://root@127.0.0.1:3306/test")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

DATABASES = ["sqlite", "postgresql", "mariadb"]
#: Suites whose database tests also run on PostgreSQL through PgBouncer in transaction
#: pooling mode (db "pgbouncer", a server the session starts: tests/pgbouncer.py).
PGBOUNCER_SUITES = {"test_semantics.py", "test_enqueue.py", "test_sched.py",
                    "test_pgbouncer.py", "test_connections.py"}
#: Suites that also run with psycopg 3 (``postgresql+psycopg://``) through that PgBouncer
#: (db "pgbouncer-psycopg": the driver deploying.md recommends behind a pooler).
PSYCOPG_SUITES = {"test_semantics.py", "test_enqueue.py", "test_sched.py"}


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def server_url(name: str) -> str:
    """The URL for a server database, or skip (fail in CI) when it is not running."""
    url, port = (PG_URL, 5432) if name == "postgresql" else (MY_URL, 3306)
    from sqlalchemy.engine import make_url

    u = make_url(url)
    if not _reachable(u.host or "127.0.0.1", u.port or port):
        msg = f"{name} is not reachable at {u.host}:{u.port or port}"
        if IN_CI:
            pytest.fail(msg + " (CI=true: every database test must run)")
        pytest.skip(msg + "; start it or set AIOJOBQUEUE_TEST_PG / AIOJOBQUEUE_TEST_MYSQL")
    return url


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Add "pgbouncer" to the databases of the PGBOUNCER_SUITES (a parametrize mark, which
    takes precedence over the ``db`` fixture's own params); other suites are unchanged."""
    def names(mark: pytest.Mark) -> list[str]:
        arg = mark.args[0]
        return [n.strip() for n in arg.split(",")] if isinstance(arg, str) else list(arg)

    marks = metafunc.definition.iter_markers("parametrize")
    suite = metafunc.definition.path.name
    if ("db" in metafunc.fixturenames and suite in PGBOUNCER_SUITES
            and not any("db" in names(m) for m in marks)):
        extra = ["pgbouncer", *(["pgbouncer-psycopg"] if suite in PSYCOPG_SUITES else [])]
        metafunc.definition.add_marker(
            pytest.mark.parametrize("db", [*DATABASES, *extra], indirect=True))


@pytest.fixture(scope="session")
def pgbouncer() -> Iterator[Any]:
    """PgBouncer (transaction pooling, 4 server connections) in front of the test
    PostgreSQL, for the whole session; skips (fails in CI) where it is not installed."""
    from pgbouncer import PgBouncer

    server_url("postgresql")
    if PgBouncer.binary() is None:
        msg = "pgbouncer is not installed (apt-get install pgbouncer)"
        if IN_CI:
            pytest.fail(msg + " (CI=true: every database test must run)")
        pytest.skip(msg)
    bouncer = PgBouncer(PG_URL)
    bouncer.start()
    try:
        yield bouncer
    finally:
        bouncer.stop()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that restart the database servers run last, so nothing else sees the outage."""
    items.sort(key=lambda item: item.get_closest_marker("restart") is not None)


@pytest.fixture(params=DATABASES)
def db(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """The name of the database under test."""
    return str(request.param)


@pytest.fixture
def db_url(db: str, tmp_path: Any, request: pytest.FixtureRequest) -> str:
    if db == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path}/jobs.db"
    if db == "pgbouncer":
        return str(request.getfixturevalue("pgbouncer").url)
    if db == "pgbouncer-psycopg":
        return str(request.getfixturevalue("pgbouncer").url).replace("+asyncpg", "+psycopg")
    return server_url(db)


@pytest.fixture
def prefix() -> str:
    return f"t{uuid.uuid4().hex[:10]}_"


async def drop_tables(url: str, prefix: str) -> None:
    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(build_tables(prefix).metadata.drop_all)
    finally:
        await engine.dispose()


@pytest_asyncio.fixture
async def make_queue(db_url: str, prefix: str, db: str
                     ) -> AsyncIterator[Callable[..., JobQueue]]:
    """``make_queue(**options)`` -> a JobQueue on the database under test (not started).

    Defaults are fast for tests (short poll and lease); tables are dropped afterwards."""
    made: list[JobQueue] = []

    def factory(**kw: Any) -> JobQueue:
        opts: dict[str, Any] = {
            "prefix": prefix, "poll_interval": 0.05, "lease_ttl": 3.0,
            "heartbeat_interval": 0.5, "retry_backoff": 0.01, "retry_backoff_max": 0.05,
            "shutdown_timeout": 2.0,
        }
        opts.update(kw)
        q = JobQueue(db_url, **opts)
        made.append(q)
        return q

    yield factory
    for q in made:
        await q.close()
    if not db_url.startswith("sqlite"):
        # behind PgBouncer: the same database, reached directly
        await drop_tables(PG_URL if db.startswith("pgbouncer") else db_url, prefix)


@pytest_asyncio.fixture
async def queue(make_queue: Callable[..., JobQueue]) -> AsyncIterator[JobQueue]:
    """A started JobQueue on the database under test."""
    q = make_queue()
    async with q:
        yield q


async def eventually(pred: Callable[[], Any], timeout: float = 10.0, every: float = 0.02) -> None:
    """Poll ``pred`` (sync or async) until true, or fail after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        r = pred()
        if asyncio.iscoroutine(r):
            r = await r
        if r:
            return
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(every)

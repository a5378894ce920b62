"""PostgreSQL behind a transaction pooler (PgBouncer ``pool_mode = transaction``).

Each transaction may run on another server connection, so nothing may outlive one: no
session ``SET`` (only function-level ``SET`` in the routines), no session advisory lock, no
prepared statement kept across transactions. pooler_connect_args() finds such a pooler when
the queue builds its engine and turns the statement caches off; refuse_caching_engine()
stops a ready-made engine that keeps them; the listener (listener.py) checks that its own
notification comes back.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine
from sqlalchemy.pool import NullPool

from ...errors import ConfigurationError
from .drivers import ASYNCPG_POOLED, announced_pid, keeps_statements, pooled_args

#: asyncpg's options under a transaction pooler (see drivers.py; psycopg's: PSYCOPG_POOLED)
POOLED_CONNECT_ARGS: dict[str, Any] = ASYNCPG_POOLED


async def backend_pids(conn: AsyncConnection) -> tuple[int, int]:
    """(the backend pid the connection announced at start-up, the server's own)."""
    raw = await conn.get_raw_connection()
    real = (await conn.exec_driver_sql("SELECT pg_backend_pid()")).scalar_one()
    return announced_pid(raw.driver_connection), int(real)


async def pooler_connect_args(url: URL) -> dict[str, Any]:
    """The driver's pooled options (drivers.pooled_args: asyncpg's POOLED_CONNECT_ARGS,
    psycopg's PSYCOPG_POOLED) where ``url`` reaches PostgreSQL through a pooler, else {}.

    A pooler (PgBouncer, and the others that multiplex) hands the client a made-up backend
    key at start-up, since the client never owns a server connection: the pid the
    connection announced is not the pid ``pg_backend_pid()`` reports. The probe runs on a
    throwaway connection that itself prepares nothing by name."""
    pooled = pooled_args(url.get_driver_name())
    engine = create_async_engine(url, poolclass=NullPool, connect_args=pooled)
    try:
        async with engine.connect() as conn:
            announced, real = await backend_pids(conn)
    finally:
        await engine.dispose()
    return pooled if announced != real else {}


def no_prepare_behind_a_pooler(dbapi_conn: Any, _record: Any) -> None:
    """On each new psycopg (3) connection of SyncQueue's sync engines: behind a pooler (the
    same test as pooler_connect_args), prepare nothing by name (psycopg prepares a statement
    it has run 5 times, on the server connection of the moment)."""
    announced = dbapi_conn.info.backend_pid
    real = dbapi_conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    if not dbapi_conn.autocommit:
        dbapi_conn.rollback()  # (the probe began a transaction)
    if announced != real:
        dbapi_conn.prepare_threshold = None


async def refuse_caching_engine(conn: AsyncConnection) -> None:
    """Behind a pooler, an engine that keeps prepared statements (one the caller built
    without POOLED_CONNECT_ARGS) fails at random later: raise ConfigurationError now."""
    announced, real = await backend_pids(conn)
    if announced == real:
        return
    raw = await conn.get_raw_connection()
    if keeps_statements(raw.dbapi_connection, raw.driver_connection):
        raise ConfigurationError(
            "this engine reaches PostgreSQL through a connection pooler (the backend pid "
            "differs from the one the connection announced) but keeps prepared "
            "statements, which a transaction pooler breaks: create it with "
            f"connect_args={pooled_args(conn.dialect.driver)!r}, or pass the URL to "
            "JobQueue")

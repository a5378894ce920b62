"""PostgreSQL: one UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING,
and LISTEN/NOTIFY on a dedicated connection outside the pool to wake idle workers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import BigInteger, Select, any_, bindparam, func, literal, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from .base import DialectOps, Listener, WakeCallback

log = logging.getLogger("aiojobqueue.listener")

# deadlock, serialization failure, lock timeout, admin shutdown, cannot connect now
_TRANSIENT = {"40P01", "40001", "55P03", "57P01", "57P02", "57P03", "08000", "08003", "08006"}


class PostgresOps(DialectOps):
    name = "postgresql"
    autocommit_insert = True
    autocommit_writes = True

    def _insert_ignore(self, table: Any) -> Any:
        return pg_insert(table).on_conflict_do_nothing()

    def in_ids(self, col: Any, ids: Sequence[int]) -> Any:
        return col == any_(literal(list(ids), ARRAY(BigInteger)))

    def in_ids_param(self, col: Any, name: str) -> Any:
        return col == any_(bindparam(name, type_=ARRAY(BigInteger)))

    def in_select(self, col: Any, sel: Select[Any]) -> Any:
        # "= ANY(ARRAY(sub-select))": an InitPlan feeding an index scan. A plain IN becomes a
        # semi-join, and the generic plan guesses the sub-select large: hash join over a
        # sequential scan of the whole jobs table.
        return col == any_(func.array(sel.scalar_subquery()))

    def skip_locked(self, stmt: Select[Any]) -> Select[Any]:
        return stmt.with_for_update(skip_locked=True)

    def for_update(self, stmt: Select[Any]) -> Select[Any]:
        return stmt.with_for_update()

    async def notify(self, conn: AsyncConnection, payload: str = "") -> None:
        await conn.execute(select(func.pg_notify(self.channel(), payload)))

    def notify_expr(self) -> Any:
        # Evaluated once per returned row, but NOTIFY collapses identical notifications of
        # one transaction into one.
        return func.pg_notify(self.channel(), "")

    def listener(self, engine: AsyncEngine) -> Listener:
        return _PgListener(engine, self.channel())

    def _is_transient(self, exc: BaseException) -> bool:
        if isinstance(exc, DBAPIError):
            code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
            if code in _TRANSIENT:
                return True
            cause = exc.orig.__cause__ if exc.orig is not None else None
            name = type(cause).__name__ if cause is not None else ""
            return "Connection" in name or "CannotConnect" in name
        return False


class _PgListener(Listener):
    """LISTEN on its own NullPool connection: never returned to a pool, never runs SQLAlchemy
    statements (a transaction left open there would hold back every notification)."""

    def __init__(self, engine: AsyncEngine, channel: str) -> None:
        self._url = engine.url
        self._channel = channel

    async def run(self, on_wake: WakeCallback) -> None:
        engine = create_async_engine(self._url, poolclass=NullPool)
        delay = 0.1
        try:
            while True:
                try:
                    await self._listen_once(engine, on_wake)
                    delay = 0.1
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # reconnect: polling covers the gap
                    log.warning("LISTEN connection lost (%s); reconnecting in %.1fs", exc, delay)
                    on_wake("")  # something may have happened while we were deaf
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
        finally:
            await engine.dispose()

    async def _listen_once(self, engine: AsyncEngine, on_wake: WakeCallback) -> None:
        conn = await engine.connect()
        try:
            raw = await conn.get_raw_connection()
            apg: Any = raw.driver_connection
            lost = asyncio.get_running_loop().create_future()

            def _on_notify(_c: Any, _pid: int, _ch: str, payload: str) -> None:
                on_wake(payload)

            def _on_close(_c: Any) -> None:
                if not lost.done():
                    lost.set_result(None)

            await apg.add_listener(self._channel, _on_notify)
            apg.add_termination_listener(_on_close)
            on_wake("")
            try:
                while not lost.done():
                    # is_closed() alone misses a silently dead socket: probe it now and then.
                    try:  # asyncio.timeout: 3.11's wait_for can swallow a cancellation
                        async with asyncio.timeout(30.0):
                            await asyncio.shield(lost)
                    except TimeoutError:
                        await apg.execute("SELECT 1")
                raise ConnectionError("listener connection closed")
            finally:
                if not apg.is_closed():
                    await apg.remove_listener(self._channel, _on_notify)
        finally:
            await conn.close()

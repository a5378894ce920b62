"""Database: the engine, the dialect's ops, the tables, the statement cache, and the one place
that decides what a database error means (retry the transaction, back off, or crash).

Every inner part talks to the database through one of these helpers:

* ``write(fn)``: one write transaction; a lock conflict or deadlock retries it whole.
* ``write_sync(fn)``: the same for a synchronous ``fn``; where the dialect has a side writer
  (SQLite) it runs wholly in a thread, to its end whatever the event loop is doing.
* ``read(fn)``: a read-only transaction; a dead pooled connection is retried on a fresh one.
* ``autocommit(fn)``: statements that are atomic on their own, no BEGIN/COMMIT; not retried.
* ``resilient(name, loop)``: a side loop that survives outages (log, back off, go on).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy import Connection
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .dialects.base import DialectOps
from .logs import brief
from .schema import Tables

log = logging.getLogger("aiojobqueue.worker")
T = TypeVar("T")


class Database:
    """One started queue's handle on its database (see the module docstring)."""

    def __init__(self, engine: AsyncEngine, ops: DialectOps, tables: Tables,
                 worker_id: str) -> None:
        self.engine = engine
        self.ops = ops
        self.t = tables
        self.worker_id = worker_id
        #: Hot statements built once (claim, finalize, settle): no per-round construction and
        #: one compiled form each; keyed by their role and shape (see ``stmt``).
        self.stmts: dict[Any, Any] = {}

    def stmt(self, key: Any, build: Callable[[], Any]) -> Any:
        """The statement cached under ``key``, built by ``build()`` the first time."""
        stmt = self.stmts.get(key)
        if stmt is None:
            stmt = self.stmts[key] = build()
        return stmt

    # -- what an error means ----------------------------------------------------------------
    def is_conflict(self, exc: BaseException) -> bool:
        """A lock conflict, deadlock or lost connection: running the transaction again is
        right (drivers may raise unwrapped errors: the dialect knows its codes)."""
        return self.ops.is_transient(exc)

    def is_outage(self, exc: BaseException) -> bool:
        """The database is away or busy (back off and try again) rather than a bug (crash
        loudly)."""
        return self.ops.is_transient(exc) or isinstance(
            exc, (OperationalError, InterfaceError, OSError, TimeoutError))

    async def retrying(self, once: Callable[[], Awaitable[T]], retries: int,
                       again: Callable[[BaseException], bool] | None = None) -> T:
        """``once()``, again after a short jittered backoff on a conflict (or where
        ``again`` says so), up to ``retries`` times (0: never: a retry would hide a commit
        whose answer was lost)."""
        delay = 0.005
        again = again or self.is_conflict
        for attempt in range(retries + 1):
            try:
                return await once()
            except Exception as exc:
                if attempt == retries or not again(exc):
                    raise
                await asyncio.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 1.0)
        raise AssertionError("unreachable")

    async def resilient(self, name: str, loop: Callable[[], Awaitable[Any]]) -> None:
        """Run a side loop until it returns; an outage is logged and retried with backoff,
        any other error ends it (and its TaskGroup) loudly."""
        delay = 0.2
        while True:
            try:
                await loop()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not self.is_outage(exc):
                    raise
                log.warning("%s: database error (%s); retrying in %.1fs", name, brief(exc), delay,
                            extra={"worker": self.worker_id})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    # -- transactions -----------------------------------------------------------------------
    async def write(self, fn: Callable[[AsyncConnection], Awaitable[T]], retries: int = 8) -> T:
        """Run ``fn`` in one write transaction; conflicts retry it whole."""
        engine = self.engine

        async def once() -> T:
            async with engine.begin() as conn:
                return await fn(conn)

        return await self.retrying(once, retries)

    async def write_refused_again(self, fn: Callable[[AsyncConnection], Awaitable[T]],
                                  retries: int = 8) -> T:
        """``write()`` for a transaction whose commit must not be repeated blindly (one
        that finalizes): run again only where the database refused it whole
        (DialectOps.is_rollback: a deadlock, a lock timeout), never after a lost
        connection, whose commit may have landed."""
        engine = self.engine

        async def once() -> T:
            async with engine.begin() as conn:
                return await fn(conn)

        return await self.retrying(once, retries, self.ops.is_rollback)

    async def write_sync(self, fn: Callable[[Connection], T], retries: int = 8) -> T:
        """``write()`` for a synchronous ``fn``. Where the dialect has a side writer (SQLite)
        the transaction runs wholly in a thread on a connection of its own: once it holds
        the database's write lock it commits and lets go even while a handler blocks this
        event loop, so other processes' writes never wait on it. For the side loops' short
        transactions (the heartbeat), not the hot path."""
        side = self.ops.side_writer(self.engine)
        if side is None:
            return await self.write(lambda conn: conn.run_sync(fn), retries)

        def once() -> T:
            with side.begin() as conn:
                return fn(conn)

        return await self.retrying(lambda: asyncio.to_thread(once), retries)

    async def autocommit(self, fn: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """Run ``fn`` on a connection in autocommit: each statement commits by itself, so
        ``fn`` must only issue statements that are atomic on their own. Not retried: the
        caller decides (a lost answer may hide a commit)."""
        async with self.engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            return await fn(conn)

    async def read(self, fn: Callable[[AsyncConnection], Awaitable[T]], retries: int = 3) -> T:
        """Run a read-only ``fn``; a pooled connection that died (a database restart) or a
        lock conflict is retried on a fresh one, since reading twice is harmless."""
        engine, ops = self.engine, self.ops

        async def once() -> T:
            async with engine.connect() as conn:
                ro = ops.read_only(conn)
                if ro is not None:
                    conn = await ro
                return await fn(conn)

        return await self.retrying(once, retries)

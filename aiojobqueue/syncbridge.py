"""How ``SyncQueue`` runs JobQueue's own insert path (insert.py) on a sync SQLAlchemy
``Connection``: the path is written against ``AsyncConnection``, and every await in it is a
statement, so a stand-in whose awaitables answer at once (``SyncConnection``) lets the
coroutine run to its end without an event loop (``drive``): one implementation of the
insert, its checks and its errors, for both clients."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar, cast

from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

T = TypeVar("T")


class SyncConnection:
    """What the insert path uses of an ``AsyncConnection``, answered at once by a sync
    ``Connection`` (the results are the same buffered ``CursorResult``s)."""

    def __init__(self, conn: Connection, ops: Any) -> None:
        self._conn = conn
        self._ops = ops
        self.dialect = conn.dialect

    async def execute(self, statement: Any, parameters: Any = None, **kw: Any) -> Any:
        return self._conn.execute(statement, parameters, **kw)

    async def scalar(self, statement: Any, parameters: Any = None) -> Any:
        return self._conn.scalar(statement, parameters)

    async def exec_driver_sql(self, sql: str, parameters: Any = None) -> Any:
        # the dialect's bulk SQL is written for its async driver's parameter style
        sql, parameters = self._ops.sync_driver_sql(sql, parameters, self.dialect.driver)
        return self._conn.exec_driver_sql(sql, parameters)

    def get_execution_options(self) -> Any:
        return self._conn.get_execution_options()

    @property
    def engine(self) -> Any:
        """The sync engine."""
        return self._conn.engine

    @property
    def sync_connection(self) -> Connection:
        """The sync ``Connection`` itself, as an ``AsyncConnection`` names its own (where a
        dialect hooks the transaction's commit, e.g. the MySQL bell)."""
        return self._conn

    @property
    def info(self) -> dict[Any, Any]:
        """The connection's own ``info`` (what its commit hooks read)."""
        return self._conn.info


def bridge(conn: Connection, ops: Any) -> AsyncConnection:
    """``conn`` as the insert path takes it (see SyncConnection)."""
    return cast(AsyncConnection, SyncConnection(conn, ops))


def drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (its awaits are answered at once) to its end,
    without an event loop."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("aiojobqueue: a synchronous insert waited on an event loop")

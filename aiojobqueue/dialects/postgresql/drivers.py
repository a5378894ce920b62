"""What differs between the two async PostgreSQL drivers aiojobqueue runs on: asyncpg
(``postgresql+asyncpg://``, what a plain ``postgresql://`` gets) and psycopg 3
(``postgresql+psycopg://``).

Behind a transaction pooler the difference is the wire: with no statement kept prepared,
asyncpg sends each statement as Parse/Describe/Flush, waits for the description, then
Bind/Execute/Sync (two round trips, the pooler's server connection held for both);
psycopg with ``prepare_threshold=None`` sends Parse/Bind/Describe/Execute/Sync at once (one
round trip). Everything that touches the driver's own connection object goes through here:
the pooler's options and checks (pooler.py), the LISTEN link (listener.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

#: asyncpg under a transaction pooler: SQLAlchemy's statement cache off (it would keep
#: named statements across transactions) and asyncpg's too, which makes asyncpg prepare each
#: statement unnamed: Parse/Describe/Flush, then Bind/Execute/Sync, so the pooler keeps one
#: server connection for both, and no name can clash with another client's on a shared
#: server connection. Costs a round trip and a parse per statement.
ASYNCPG_POOLED: dict[str, Any] = {"statement_cache_size": 0,
                                  "prepared_statement_cache_size": 0}
#: psycopg under a transaction pooler: never prepare by name (it would after 5 runs of a
#: statement); each statement is then one unnamed Parse/Bind/Execute/Sync: one round trip.
PSYCOPG_POOLED: dict[str, Any] = {"prepare_threshold": None}


def pooled_args(driver: str) -> dict[str, Any]:
    """The connect_args that keep no prepared statement past a transaction, for a
    SQLAlchemy driver name (``asyncpg``, ``psycopg``)."""
    return dict(PSYCOPG_POOLED if driver == "psycopg" else ASYNCPG_POOLED)


def announced_pid(driver_conn: Any) -> int:
    """The backend pid the connection announced at start-up (BackendKeyData)."""
    if hasattr(driver_conn, "get_server_pid"):  # asyncpg
        return int(driver_conn.get_server_pid())
    return int(driver_conn.info.backend_pid)  # psycopg


def keeps_statements(dbapi_conn: Any, driver_conn: Any) -> bool:
    """Whether a connection keeps prepared statements past a transaction (SQLAlchemy's or
    asyncpg's cache, or psycopg preparing what it ran often)."""
    if hasattr(driver_conn, "prepare_threshold"):  # psycopg
        return driver_conn.prepare_threshold is not None
    return (getattr(dbapi_conn, "_prepared_statement_cache", None) is not None
            or bool(getattr(driver_conn, "_stmt_cache_enabled", False)))


NotifyCallback = Callable[[str], None]


class ListenLink:
    """LISTEN on one driver connection: ``start()`` subscribes and calls ``on_notify(payload)``
    for each notification, ``lost`` resolves when the connection closes, ``ping()`` checks a
    silent socket, ``stop()`` unsubscribes (a closed connection: nothing to do)."""

    def __init__(self, driver_conn: Any, channel: str, on_notify: NotifyCallback) -> None:
        self.conn = driver_conn
        self.channel = channel
        self.on_notify = on_notify
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def _closed(self, *_: Any) -> None:
        if not self.lost.done():
            self.lost.set_result(None)

    async def start(self) -> None:
        await self.conn.add_listener(self.channel, self._notify)
        self.conn.add_termination_listener(self._closed)

    def _notify(self, _c: Any, _pid: int, _ch: str, payload: str) -> None:
        self.on_notify(payload)

    async def ping(self) -> None:
        await self.conn.execute("SELECT 1")

    async def stop(self) -> None:
        if not self.conn.is_closed():
            await self.conn.remove_listener(self.channel, self._notify)


    async def close(self) -> None:
        """Close the driver connection itself (one detached from SQLAlchemy's pool)."""
        with contextlib.suppress(Exception):  # (already gone: nothing to close)
            await self.conn.close()


class PsycopgListenLink(ListenLink):
    """ListenLink on a psycopg AsyncConnection: autocommit (LISTEN takes effect at once),
    a task that reads ``notifies()``; ping() runs between its reads (a notification that
    arrives meanwhile waits in psycopg's backlog for the next read)."""

    _pump: asyncio.Task[None] | None = None
    _quiet: asyncio.Event

    async def start(self) -> None:
        from psycopg import sql

        await self.conn.set_autocommit(True)
        await self.conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.channel)))
        self._quiet = asyncio.Event()
        self._pump = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        try:
            while True:
                # a bounded read, so ping() gets the connection between reads
                async for n in self.conn.notifies(timeout=0.5):
                    self.on_notify(n.payload)
                if self._quiet.is_set():
                    self._quiet.clear()
                    await self.conn.execute("SELECT 1")
        except asyncio.CancelledError:
            raise
        except Exception:
            pass
        finally:
            self._closed()

    async def ping(self) -> None:
        self._quiet.set()  # the reader runs it at its next pause, on the same connection

    async def stop(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)
        # the connection is closed next by the caller: that ends the LISTEN


def listen_link(driver_conn: Any, channel: str, on_notify: NotifyCallback) -> ListenLink:
    """The ListenLink for the driver behind ``driver_conn``."""
    if hasattr(driver_conn, "notifies"):
        return PsycopgListenLink(driver_conn, channel, on_notify)
    return ListenLink(driver_conn, channel, on_notify)

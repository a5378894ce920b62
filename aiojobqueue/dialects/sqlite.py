"""SQLite: no row locks, so every writing transaction starts with BEGIN IMMEDIATE.

The write lock taken at BEGIN makes the claim (and every finalize) exclusive; readers use
DEFERRED so they never queue behind writers. WAL lets readers run during writes, and the
busy timeout turns "database is locked" into a wait (retried further up if it still fires).
"""

from __future__ import annotations

import asyncio
import collections
import sqlite3
from collections.abc import Callable
from functools import cached_property
from typing import Any

from sqlalchemy import CTE, Engine, Select, create_engine, event, select, union_all
from sqlalchemy.dialects.sqlite import insert as lite_insert
from sqlalchemy.engine import URL, Connection
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ..errors import ConfigurationError
from .base import DialectOps, Listener, WakeCallback
from .bulk import JOB_FIELDS, JobColumns, json_rows_params, run_bulk_insert, varying_fields
from .columns import _EPOCH

BUSY_TIMEOUT_MS = 30_000
#: How often an idle worker looks for commits made by other connections.
WATCH_EVERY = 0.005


def _hook(engine: Engine) -> Engine:
    """WAL, a busy timeout and full sync on each connection; BEGIN IMMEDIATE (or the mode an
    ``ajq_begin`` execution option names) for each transaction. Once per engine."""
    if getattr(engine, "_ajq_hooks", False):
        return engine

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _rec: Any) -> None:
        _one_hop(dbapi_conn)
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (below)
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA synchronous=FULL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get("ajq_begin", "IMMEDIATE")
        raw = conn.connection.dbapi_connection
        if type(raw) in _FAST_KINDS:  # sent with the transaction's first statement
            raw._connection._ajq_begin = f"BEGIN {mode}"  # type: ignore[union-attr]
        else:
            conn.exec_driver_sql(f"BEGIN {mode}")

    engine._ajq_hooks = True  # type: ignore[attr-defined]
    return engine


class _Ran:
    """What a statement run by _OneHopCursor left: the cursor attributes SQLAlchemy reads."""

    __slots__ = ("arraysize", "description", "lastrowid", "rowcount")

    def __init__(self, description: Any = None, rowcount: int = -1,
                 lastrowid: int | None = None) -> None:
        self.description, self.rowcount, self.lastrowid = description, rowcount, lastrowid
        self.arraysize = 1

    def close(self) -> None:
        return None


def _run(conn: sqlite3.Connection, begin: str | None, many: bool, sql: str,
         params: Any) -> tuple[_Ran, list[Any]]:
    """One statement start to end in the aiosqlite thread: cursor, execute, rows, close;
    after ``begin``, the BEGIN of the transaction it is the first statement of."""
    if begin is not None:
        conn.execute(begin)
    cur = conn.cursor()
    try:
        if many:
            cur.executemany(sql, params)
        elif params is None:
            cur.execute(sql)
        else:
            cur.execute(sql, params)
        desc = cur.description
        rows = cur.fetchall() if desc else []
        return _Ran(desc, cur.rowcount, cur.lastrowid), rows
    finally:
        cur.close()


def _one_hop(dbapi_conn: Any) -> None:
    """Run each statement in one trip to aiosqlite's thread instead of three or four.

    SQLAlchemy's aiosqlite cursor makes a trip each to open a cursor, execute, fetch the
    rows and close it; each trip is a thread hand-off and an event-loop wake-up, which on a
    loaded machine cost more than the statement (profiled: a capacity=1 worker spent most of
    its time waiting in epoll for them). Likewise a transaction's BEGIN travels with its
    first statement, and the pool's rollback of a connection that holds no transaction (after
    every commit) stays home. The classes are swapped on this connection only, and only
    where SQLAlchemy's adapter has the shape this was written for."""
    cls = type(dbapi_conn)
    fast = _FAST.get(cls)
    if fast is None:
        fast = _one_hop_kind(cls, dbapi_conn)
        if fast is None:
            return  # pragma: no cover - another SQLAlchemy layout: keep its own
        _FAST[cls] = fast
        _FAST_KINDS.add(fast)
    dbapi_conn.__class__ = fast


def _one_hop_kind(cls: type, dbapi_conn: Any) -> type | None:
    """The one-hop subclass of SQLAlchemy's aiosqlite connection class ``cls`` (of which
    ``dbapi_conn`` is one), or None where its adapter has another shape."""
    try:
        from sqlalchemy.connectors.asyncio import AsyncAdapt_dbapi_cursor
        from sqlalchemy.util.concurrency import await_
    except ImportError:  # pragma: no cover - another SQLAlchemy layout: keep its own
        return None
    base = getattr(cls, "_cursor_cls", None)
    if not (isinstance(base, type) and issubclass(base, AsyncAdapt_dbapi_cursor)
            and hasattr(base, "_execute_async") and hasattr(dbapi_conn, "_execute_mutex")):
        return None  # pragma: no cover - another SQLAlchemy layout: keep its own
    del await_
    return _one_hop_connection(cls, _one_hop_cursor(base))


def _one_hop_cursor(base: type) -> type:
    """A subclass of the adapter's cursor class ``base`` that runs a statement start to end
    (_run) in one trip, sending the transaction's pending BEGIN with it."""

    class _OneHopCursor(base):  # type: ignore[misc]
        __slots__ = ()
        _awaitable_cursor_close = False

        def _make_new_cursor(self, connection: Any) -> Any:
            return _Ran()

        def _aenter_cursor(self, cursor: Any) -> Any:
            return cursor

        async def _execute_async(self, operation: Any, parameters: Any) -> Any:
            return await self._go(False, operation, parameters)

        async def _executemany_async(self, operation: Any, seq: Any) -> Any:
            return await self._go(True, operation, seq)

        async def _go(self, many: bool, operation: Any, parameters: Any) -> None:
            aconn = self._connection
            async with self._adapt_connection._execute_mutex:
                begin = aconn.__dict__.pop("_ajq_begin", None)
                # sent: until a commit or rollback, the connection may hold a transaction
                # (even if this await is cancelled: the thread still runs it)
                aconn._ajq_sent = True
                self._cursor, rows = await aconn._execute(  # type: ignore[misc]
                    _run, aconn._conn, begin, many, operation, parameters)
                self._rows = collections.deque(rows)  # type: ignore[misc]

    return _OneHopCursor


def _one_hop_connection(cls: type, cursor_cls: type) -> type:
    """A subclass of the adapter's connection class ``cls`` with ``cursor_cls`` as its
    cursors, whose commit and rollback make no trip when no statement was sent."""

    class _OneHopConnection(cls):  # type: ignore[misc]
        __slots__ = ()
        _cursor_cls = cursor_cls

        def commit(self) -> None:
            state = self._connection.__dict__
            if state.pop("_ajq_begin", None) is None:  # (else no statement ran: done)
                super().commit()
                state["_ajq_sent"] = False

        def rollback(self) -> None:
            state = self._connection.__dict__
            state.pop("_ajq_begin", None)  # a BEGIN not sent yet is simply dropped
            if not state.get("_ajq_sent", True):
                return  # nothing sent since the last commit/rollback: no trip
            super().rollback()  # queued behind whatever the thread still runs
            state["_ajq_sent"] = False

    return _OneHopConnection


_FAST: dict[type, type] = {}
_FAST_KINDS: set[type] = set()


class SQLiteOps(DialectOps):
    name = "sqlite"
    async_scheme = "sqlite+aiosqlite"
    sync_scheme = "sqlite+pysqlite"

    @staticmethod
    def check_shared(url: URL) -> None:
        if (url.database or ":memory:").startswith((":memory:", "file::memory:")):
            raise ConfigurationError(
                "SyncQueue needs a database file (or server) that its workers share, not "
                "an in-memory SQLite database")

    @classmethod
    def sync_engine(cls, url: Any, pool_size: int, **kwargs: Any) -> Engine:
        # WAL, busy timeout and BEGIN IMMEDIATE as on the async engine; the connections
        # serve whichever thread checks them out
        return _hook(create_engine(url, pool_size=pool_size, max_overflow=0,
                                   connect_args={"check_same_thread": False}, **kwargs))

    def round_kind(self, routines: bool) -> str:
        # The database runs in this process, one writer at a time: a round's finalize and
        # claim share one transaction (see worker/rounds.py).
        return "shared"

    def materialized(self, cte: CTE) -> CTE:
        return cte.prefix_with("MATERIALIZED")

    def __init__(self, tables: Any) -> None:
        super().__init__(tables)
        self._side: Engine | None = None

    def prepare_engine(self, engine: AsyncEngine) -> AsyncEngine:
        _hook(engine.sync_engine)
        return engine

    def side_writer(self, engine: AsyncEngine) -> Engine | None:
        """A plain (pysqlite) engine on the same file, for write transactions run wholly in
        a thread (see Database.write_sync): aiosqlite hands each statement back to the event
        loop, so a transaction it has begun holds the file's write lock for as long as a
        handler blocks that loop, and every other process's write waits. None in memory
        (another connection would open another database)."""
        if self._side is None:
            path = engine.url.database
            if not path or path == ":memory:" or path.startswith("file::memory:"):
                return None
            self._side = _hook(create_engine(
                engine.url.set(drivername="sqlite"), pool_size=1, max_overflow=1,
                connect_args={"check_same_thread": False}))
        return self._side

    async def release(self) -> None:
        side, self._side = self._side, None
        if side is not None:
            side.dispose()

    def insert_ignore_stmt(self, table: Any) -> Any:
        return lite_insert(table).on_conflict_do_nothing()

    def pick_groups(self, pick: Callable[[Any, Any], Select[Any]], k: int
                    ) -> tuple[Any, Callable[[list[str], list[int]], dict[str, Any]]]:
        # SQLite takes no ORDER BY / LIMIT in a compound's part: each is a sub-select
        stmt, bind = super().pick_groups(pick, k)
        parts = []
        for part in stmt.selects:
            sub = part.subquery()
            parts.append(select(*sub.c))
        return union_all(*parts), bind

    def skip_locked(self, stmt: Select[Any]) -> Select[Any]:
        return stmt  # BEGIN IMMEDIATE already made this transaction the only writer

    def for_update(self, stmt: Select[Any]) -> Select[Any]:
        return stmt

    async def lock_gate(self, conn: AsyncConnection) -> None:
        return None  # the write lock is the gate

    async def begin_write(self, conn: AsyncConnection) -> None:
        # A caller's connection has no BEGIN IMMEDIATE: the driver begins (deferred) at the
        # first write, so the insert's reads (keys, upstream states) could go stale before
        # its INSERT, and a dependent of a job finishing meanwhile would wait forever. A
        # write that changes nothing takes the write lock first (a no-op if held).
        await conn.exec_driver_sql(f'UPDATE "{self.t.meta.name}" SET value = value WHERE 0')

    def read_only(self, conn: AsyncConnection) -> Any:
        return conn.execution_options(ajq_begin="DEFERRED")

    def listener(self, engine: AsyncEngine) -> Listener | None:
        path = engine.url.database
        if not path or path == ":memory:" or path.startswith("file::memory:"):
            return None
        return _DataVersionWatch(path)

    def is_rollback(self, exc: BaseException) -> bool:
        # busy or locked: the statement did not run, and the caller rolls back (a COMMIT
        # that is refused leaves the transaction open, rolled back as well)
        return self._is_transient(exc)

    def _is_transient(self, exc: BaseException) -> bool:
        if isinstance(exc, OperationalError):
            name = getattr(exc.orig, "sqlite_errorname", "") or ""
            text = str(exc.orig).lower()
            return name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in text
        return False


    async def insert_jobs(self, conn: AsyncConnection, cols: JobColumns, wake: bool) -> list[int]:
        """One INSERT ... SELECT FROM json_each(:rows) RETURNING id: the fields that vary
        travel as one JSON array of rows (SQLite parses it in C), the others as one value
        each; no per-row parameter processing. Rows are inserted in array order under the
        write lock, so their ids ascend in that order (as for the multi-row INSERT)."""
        varying = sorted(varying_fields(cols)) or ["args"]
        sql = self._bulk_sql.get(tuple(varying))
        if sql is None:
            sql = self._bulk_sql[tuple(varying)] = self._bulk_insert_sql(varying)
        # run_after is stored as epoch seconds (timeutil.UTCDateTime)
        cols = dict(cols, run_at=[None if t is None else (t - _EPOCH).total_seconds()
                                  for t in cols["run_at"]])
        return await run_bulk_insert(conn, sql, json_rows_params(cols, varying),
                                     len(cols["args"]))

    @cached_property
    def _bulk_sql(self) -> dict[tuple[str, ...], str]:
        return {}

    def _bulk_insert_sql(self, varying: list[str]) -> str:
        f = {name: f":{name}" for name in JOB_FIELDS}
        f.update({name: f"json_extract(value, '$[{i}]')" for i, name in enumerate(varying)})
        now = "((julianday('now') - 2440587.5) * 86400.0)"  # one instant per statement
        return f"""
INSERT INTO "{self.t.jobs.name}" (type, kind, state, args, parent_id, group_key, weight, priority,
    pending, run_after, attempts, max_attempts, attempt_limit, timeout, key, live_key,
    cancelled_by, has_dependents, error, created_at, finished_at, trace)
SELECT {f["type"]}, {f["kind"]}, {f["state"]}, {f["args"]}, {f["parent_id"]}, {f["group_key"]},
    {f["weight"]}, {f["priority"]}, {f["pending"]},
    COALESCE({f["run_at"]}, {now} + {f["delay"]}), 0, {f["max_attempts"]}, {f["max_attempts"]},
    {f["timeout"]}, {f["key"]}, CASE WHEN {f["dead"]} THEN NULL ELSE {f["key"]} END,
    {f["cancelled_by"]}, {f["has_dependents"]}, {f["error"]}, {now},
    CASE WHEN {f["dead"]} THEN {now} END, {f["trace"]}
FROM json_each(:rows) ORDER BY json_each.key
RETURNING id"""


class _DataVersionWatch(Listener):
    """SQLite has no NOTIFY, but ``PRAGMA data_version`` changes whenever another connection
    commits to the file. Reading it takes no lock that a writer waits for and costs a few
    microseconds, so an idle worker polls it every WATCH_EVERY seconds on a private
    connection and wakes when something was committed (an enqueue, a finished upstream).
    Polling by the worker loop stays the backstop."""

    every_commit = True

    def __init__(self, path: str) -> None:
        self._path = path

    async def run(self, on_wake: WakeCallback) -> None:
        # timeout=0: never wait on a lock from the event loop; a busy file just means "look".
        conn = sqlite3.connect(self._path, timeout=0, isolation_level=None,
                               check_same_thread=False)
        try:
            last = None
            while True:
                try:
                    version = conn.execute("PRAGMA data_version").fetchone()[0]
                except sqlite3.OperationalError:
                    version = None
                if version is None or (last is not None and version != last):
                    on_wake("")
                last = version
                await asyncio.sleep(WATCH_EVERY)
        finally:
            conn.close()

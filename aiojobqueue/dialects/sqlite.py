"""SQLite: no row locks, so every writing transaction starts with BEGIN IMMEDIATE.

The write lock taken at BEGIN makes the claim (and every finalize) exclusive; readers use
DEFERRED so they never queue behind writers. WAL lets readers run during writes, and the
busy timeout turns "database is locked" into a wait (retried further up if it still fires).
"""

from __future__ import annotations

import asyncio
import sqlite3
from functools import cached_property
from typing import TYPE_CHECKING, Any

from sqlalchemy import CTE, Engine, Select, create_engine, event
from sqlalchemy.dialects.sqlite import insert as lite_insert
from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .base import (
    JOB_FIELDS,
    DialectOps,
    JobColumns,
    Listener,
    WakeCallback,
    json_rows_params,
    run_bulk_insert,
    varying_fields,
)
from .columns import _EPOCH

if TYPE_CHECKING:
    from ..worker.rounds import ParallelRound

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
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (below)
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA synchronous=FULL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get("ajq_begin", "IMMEDIATE")
        conn.exec_driver_sql(f"BEGIN {mode}")

    engine._ajq_hooks = True  # type: ignore[attr-defined]
    return engine


class SQLiteOps(DialectOps):
    name = "sqlite"
    async_scheme = "sqlite+aiosqlite"

    def round_kind(self, routines: bool) -> type[ParallelRound]:
        # The database runs in this process, one writer at a time: a round's finalize and
        # claim share one transaction (see worker/rounds.py).
        from ..worker.rounds import SharedRound

        return SharedRound

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

    def skip_locked(self, stmt: Select[Any]) -> Select[Any]:
        return stmt  # BEGIN IMMEDIATE already made this transaction the only writer

    def for_update(self, stmt: Select[Any]) -> Select[Any]:
        return stmt

    async def lock_gate(self, conn: AsyncConnection) -> None:
        return None  # the write lock is the gate

    def read_only(self, conn: AsyncConnection) -> Any:
        return conn.execution_options(ajq_begin="DEFERRED")

    def listener(self, engine: AsyncEngine) -> Listener | None:
        path = engine.url.database
        if not path or path == ":memory:" or path.startswith("file::memory:"):
            return None
        return _DataVersionWatch(path)

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

"""The dialect seam: the few things that differ between databases.

Everything else (the tick loop, fair share, retries, roll-up) is dialect-neutral and talks to
the database only through SQLAlchemy Core plus the hooks below.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar

from sqlalchemy import Engine, Select, Table, Text, bindparam, insert, select
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ..schema import Tables

WakeCallback = Callable[[str], None]

#: Jobs to insert as one list per field (see DialectOps.insert_jobs): type, kind, state,
#: args (JSON text), parent_id, group_key, weight, priority, pending, max_attempts, timeout,
#: key, cancelled_by, has_dependents, error (JSON text or None); and the times: delay
#: (seconds from the database's now, or None) or run_at (an absolute run_after); dead (born
#: cancelled: finished now, no live_key). attempts start at 0, attempt_limit = max_attempts.
JobColumns = dict[str, list[Any]]
#: Edges per executemany call (DialectOps.insert_edges).
EDGE_CHUNK = 2500
JOB_FIELDS = (
    "type", "kind", "state", "args", "parent_id", "group_key", "weight", "priority", "pending",
    "max_attempts", "timeout", "key", "cancelled_by", "has_dependents", "error", "delay",
    "run_at", "dead",
)


def varying_fields(cols: JobColumns) -> frozenset[str]:
    """The fields whose value is not the same on every row (a bulk statement binds the
    others once). With more than one row, args always counts as varying, so the statement
    always has one per-row field to number its rows by."""
    n = len(cols["args"])
    if n == 1:
        return frozenset()
    return frozenset(
        name for name, vals in cols.items() if name == "args" or vals.count(vals[0]) != n
    )


def json_rows_params(cols: JobColumns, varying: list[str]) -> dict[str, Any]:
    """Parameters of a JSON-rows bulk INSERT (SQLite json_each, MariaDB JSON_TABLE): every
    constant field bound once, the varying ones as one JSON array of rows, ``rows``."""
    params = {name: vals[0] for name, vals in cols.items() if name not in varying}
    params["rows"] = json.dumps(list(zip(*(cols[name] for name in varying), strict=True)))
    return params


async def run_bulk_insert(
    conn: AsyncConnection, sql: str, params: dict[str, Any], n: int
) -> list[int]:
    """Run a bulk INSERT ... RETURNING id of ``n`` rows; the ids sorted (drawn in row order)."""
    got = sorted(r[0] for r in await conn.exec_driver_sql(sql, params))
    if len(got) != n:  # pragma: no cover - defensive
        raise RuntimeError("bulk INSERT returned the wrong number of ids")
    return got


class Listener(ABC):
    """A push channel that wakes idle workers (PostgreSQL LISTEN/NOTIFY)."""

    @abstractmethod
    async def run(self, on_wake: WakeCallback) -> None:
        """Listen until cancelled, calling ``on_wake(payload)``; reconnects on drops."""


class DialectOps(ABC):
    """What one database family does its own way."""

    name: ClassVar[str]
    #: UPDATE ... RETURNING exists (not on MySQL/MariaDB).
    update_returning: ClassVar[bool] = True
    #: Workers may lease a few jobs ahead of free slots (see Worker._prefetch).
    prefetch: ClassVar[bool] = True
    #: A lone multi-row INSERT ... RETURNING may run in autocommit (one round trip).
    autocommit_insert: ClassVar[bool] = False
    #: A write that is one atomic statement (the fast finalize, a claim without a gate) may
    #: run in autocommit: no BEGIN / COMMIT round trips. Where a round trip is cheap (SQLite)
    #: it joins the caller's transaction instead, one commit for all.
    autocommit_writes: ClassVar[bool] = False
    #: Two write transactions of one worker may run at once (a round's finalize and claim).
    #: Not on SQLite: one writer at a time, the second would only wait for the lock.
    parallel_writes: ClassVar[bool] = True
    #: The database runs inside this process (SQLite): a commit's answer cannot be lost on
    #: the way, so a round's finalize and claim may share one transaction (one commit).
    local_commit: ClassVar[bool] = False

    #: where the listener connects (JobQueue(listen_url=)); None: the engine's own URL
    listen_url: URL | None = None

    def __init__(self, tables: Tables) -> None:
        self.t = tables

    @staticmethod
    def engine_kwargs() -> dict[str, Any]:
        """Extra create_async_engine keywords when aiojobqueue builds the engine from a URL."""
        return {}

    def prepare_engine(self, engine: AsyncEngine) -> AsyncEngine:
        """Install hooks / options on ``engine``; returns the engine the queue should use."""
        return engine

    async def check_server(self, conn: AsyncConnection) -> None:  # noqa: B027 - optional hook
        """Raise UnsupportedDatabaseError when the server cannot run the claim."""

    def in_ids(self, col: Any, ids: Sequence[int]) -> Any:
        """``col IN (ids)``. PostgreSQL overrides it with one array parameter, so the statement
        text (and the server's prepared statement) stays the same whatever the count."""
        return col.in_(ids)

    def in_ids_param(self, col: Any, name: str) -> Any:
        """``col IN (:name)`` with the ids bound at execution, for statements built once and
        reused (no per-call construction, one compiled form)."""
        return col.in_(bindparam(name, expanding=True))

    def in_select(self, col: Any, sel: Select[Any]) -> Any:
        """``col IN (SELECT ...)`` for a key column, written so the planner probes ``col``'s
        index with the sub-select's (few) values instead of scanning the table."""
        return col.in_(sel)

    @abstractmethod
    def skip_locked(self, stmt: Select[Any]) -> Select[Any]:
        """Make a candidate SELECT lock what it returns and skip rows others hold."""

    @abstractmethod
    def for_update(self, stmt: Select[Any]) -> Select[Any]:
        """Make a SELECT lock what it returns, waiting for other holders."""

    async def lock_gate(self, conn: AsyncConnection) -> None:
        """Serialize claims that count global caps (no-op where the claim is already exclusive)."""
        m = self.t.meta
        await conn.execute(self.for_update(select(m.c.value).where(m.c.name == "gate")))

    async def insert_ignore(
        self, conn: AsyncConnection, table: Table, rows: list[dict[str, Any]]
    ) -> None:
        """Insert rows, silently skipping those whose primary key already exists."""
        await conn.execute(self._insert_ignore(table), rows)

    @abstractmethod
    def _insert_ignore(self, table: Table) -> Any: ...

    def read_only(self, conn: AsyncConnection) -> Awaitable[AsyncConnection] | None:
        """Execution options for a read-only transaction, where the dialect cares (SQLite)."""
        return None

    async def notify(self, conn: AsyncConnection, payload: str = "") -> None:  # noqa: B027
        """Send a wake-up inside the caller's transaction (delivered on commit)."""

    def notify_expr(self) -> Any:
        """An expression that sends the wake-up when evaluated inside a statement (so an
        INSERT can carry it in RETURNING instead of a separate round trip), or None."""
        return None

    def settle_routine(
        self, finish: Callable[[Any, Any, Any, Any], Any], release: Callable[[Any], Any],
        activate: Callable[[Any], Any], lease: Callable[[Any, Any, Any, Any, Any], Any],
        release_one: Callable[[Any], Any] | None = None, split: int = 0, part: int = 256,
    ) -> tuple[str, list[str]] | None:
        """(name, DDL statements) of the server-side routines that finalize successes and
        release their dependents in one call (see Completer.finish_in_one_call), or None
        where the dialect has none. ``finish(ids, attempt, owner, result)``, ``release(ids)``,
        ``activate(container ids)``, ``lease(group, n, type match, owner, ttl)`` and
        ``release_one(ids)`` build the statements they run, given the expressions of their
        own variables; ``split``: the least part of a wide fan-out released in line (0: all
        of it), ``part``: the most jobs of its rest released in one transaction."""
        return None

    def settle_calls(self, name: str) -> tuple[Any, Any, Any]:
        """The statements calling the routines of settle_routine() ``name``: the one-call
        finalize (``ids``, ``a``, ``o``, ``r`` (results as JSON text, or None), and the
        claim riding along: ``g``, ``types``, ``n`` (0: none), ``lo``, ``ttl`` -> one row:
        the ids it finished (NULL: declined), the rows it leased (JSON) and the finished
        job whose release it split, if any), the release of dependents (``ids`` -> id,
        kind, state, parent_id of the rows it changed) and the rest of split releases
        (``n``: at most that many -> how many it did)."""
        raise NotImplementedError

    async def routine_exists(self, conn: AsyncConnection, name: str) -> bool:
        """Whether the routine ``name`` of settle_routine() is installed."""
        return False

    def listener(self, engine: AsyncEngine) -> Listener | None:
        """A push listener, or None where only polling exists."""
        return None

    def channel(self) -> str:
        return f"{self.t.jobs.name}_wake"

    def is_transient(self, exc: BaseException) -> bool:
        """A lock conflict, deadlock or lost connection: retrying the transaction is right."""
        if isinstance(exc, DBAPIError) and exc.connection_invalidated:
            return True
        if isinstance(exc, (OSError, ConnectionError, TimeoutError)):
            return True
        return self._is_transient(exc)

    @abstractmethod
    def _is_transient(self, exc: BaseException) -> bool: ...

    async def insert_jobs_alone(
        self, engine: AsyncEngine, cols: JobColumns, wake: bool
    ) -> list[int] | None:
        """insert_jobs as a statement of its own in autocommit (only asked where
        ``autocommit_insert``): the jobs exist once it returns. None: no bulk path here (and
        nothing was written)."""
        async with engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            return await self.insert_jobs(conn, cols, wake)

    async def release(self) -> None:  # noqa: B027 - optional hook
        """Give back what the dialect holds between calls (JobQueue.close)."""

    def side_writer(self, engine: AsyncEngine) -> Engine | None:
        """A synchronous engine on the same database, for write transactions that must run
        to their end without the event loop (JobQueue._write_sync), or None: they run on
        ``engine`` like any other."""
        return None

    def json_param(self, name: str) -> Any:
        """A bind parameter for a JSON column that takes already encoded JSON text."""
        return bindparam(name, type_=Text())

    async def insert_jobs(
        self, conn: AsyncConnection, cols: JobColumns, wake: bool
    ) -> list[int] | None:
        """Insert jobs in one bulk statement and return their ids in order, sending the
        wake-up from that statement when ``wake``; or None where the dialect has no bulk path
        (batch.py then runs SQLAlchemy's executemany INSERT)."""
        return None

    async def insert_edges(
        self, conn: AsyncConnection, job_ids: list[int], up_ids: list[int]
    ) -> None:
        """Insert the dependency edges ``job_ids[i]`` -> ``up_ids[i]`` (executemany; a
        dialect with an array type binds them as two arrays in one statement)."""
        D = self.t.deps
        for i in range(0, len(job_ids), EDGE_CHUNK):
            await conn.execute(insert(D), [
                {"job_id": j, "depends_on_id": u}
                for j, u in zip(job_ids[i : i + EDGE_CHUNK], up_ids[i : i + EDGE_CHUNK],
                                strict=True)
            ])


def dialect_for(engine: AsyncEngine, tables: Tables) -> DialectOps:
    """Pick the dialect module by SQLAlchemy's dialect name."""
    name = engine.dialect.name
    if name == "postgresql":
        from .postgresql import PostgresOps

        return PostgresOps(tables)
    if name in ("mysql", "mariadb"):  # SQLAlchemy calls MariaDB "mysql" with mysql+ URLs
        from .mysql import MySQLOps

        return MySQLOps(tables)
    if name == "sqlite":
        from .sqlite import SQLiteOps

        return SQLiteOps(tables)
    from ..errors import UnsupportedDatabaseError

    raise UnsupportedDatabaseError(
        f"unsupported database {name!r}: use SQLite, PostgreSQL or MySQL 8+/MariaDB 10.6+"
    )


def engine_kwargs_for(url_drivername: str) -> dict[str, Any]:
    backend = url_drivername.split("+", 1)[0]
    if backend == "postgresql":
        from .postgresql import PostgresOps

        return PostgresOps.engine_kwargs()
    if backend in ("mysql", "mariadb"):
        from .mysql import MySQLOps

        return MySQLOps.engine_kwargs()
    if backend == "sqlite":
        from .sqlite import SQLiteOps

        return SQLiteOps.engine_kwargs()
    return {}


async def connect_kwargs_for(url: URL) -> dict[str, Any]:
    """Driver options (create_async_engine's ``connect_args``) that depend on what ``url``
    reaches: on PostgreSQL, no prepared statement kept across transactions when it is a
    connection pooler (see postgresql.pooler_connect_args)."""
    if url.get_backend_name() == "postgresql":
        from .postgresql import pooler_connect_args

        return await pooler_connect_args(url)
    return {}

"""The dialect seam: the few things that differ between databases.

Everything else (the tick loop, fair share, retries, roll-up) is dialect-neutral and talks to
the database only through SQLAlchemy Core plus the hooks below. The insert hooks and the
bulk insert path are bulk.py's (``InsertHooks``, which DialectOps inherits).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar

from sqlalchemy import (
    CTE,
    Engine,
    Integer,
    Select,
    String,
    Table,
    Text,
    bindparam,
    select,
    union_all,
)
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ..schema import Tables
from .bulk import InsertHooks
from .drivers import driver_needed

WakeCallback = Callable[[str], None]


class Listener(ABC):
    """A push channel that wakes idle workers (PostgreSQL LISTEN/NOTIFY, SQLite's watch of
    ``data_version``, the MySQL/MariaDB bell)."""

    #: Whether it fires on every commit (SQLite) or only where jobs became runnable; the
    #: dashboard's live view still polls for the rest where it does not.
    every_commit: ClassVar[bool] = False

    def busy(self) -> bool:
        """Whether the worker it wakes claims again now without being woken (its last claim
        came back full): a listener that polls may then look less often. The worker
        replaces this with its own (``set_busy``); alone, never busy."""
        return False

    def set_busy(self, busy: Callable[[], bool]) -> None:
        """Ask ``busy()`` for whether the woken worker is busy (see ``busy``)."""
        self.busy = busy  # type: ignore[method-assign]

    @abstractmethod
    async def run(self, on_wake: WakeCallback) -> None:
        """Listen until cancelled, calling ``on_wake(payload)``; reconnects on drops."""


class DialectOps(InsertHooks, ABC):
    """What one database family does its own way."""

    #: a short name for messages (the command line's status, logs)
    name: ClassVar[str]
    #: the SQLAlchemy scheme of the async driver a URL naming none gets (see async_url)
    async_scheme: ClassVar[str]
    #: the scheme of the sync driver SyncQueue connects with (see sync_url)
    sync_scheme: ClassVar[str]

    #: where the push listener connects (JobQueue(listen_url=), see parse_listen_url);
    #: None: the engine's own URL
    listen_url: URL | None = None
    #: the SQLAlchemy driver name of the queue's engine (``asyncpg``, ``psycopg``, ...;
    #: set by dialect_for)
    driver: str = ""

    def __init__(self, tables: Tables) -> None:
        self.t = tables

    @staticmethod
    def engine_kwargs() -> dict[str, Any]:
        """Extra create_async_engine keywords when aiojobqueue builds the engine from a URL."""
        return {}

    @staticmethod
    def normalize_url(url: URL) -> URL:
        """The URL aiojobqueue connects with, given the user's (e.g. a charset added)."""
        return url

    @staticmethod
    async def connect_args(url: URL) -> dict[str, Any]:
        """Driver options (create_async_engine's ``connect_args``) that depend on what
        ``url`` reaches, found by connecting to it (e.g. a connection pooler in between)."""
        return {}

    @staticmethod
    def parse_listen_url(url: URL) -> URL:
        """The URL the push listener connects to, given JobQueue's ``listen_url``; raises
        ConfigurationError where there is no push channel to give a connection of its own."""
        from ..errors import ConfigurationError

        raise ConfigurationError(
            "listen_url is for PostgreSQL: LISTEN/NOTIFY exists only there, other databases "
            "are polled")

    # -- how the core runs on this database (it picks its classes by these; the dialect
    # never imports them) -----------------------------------------------------------------
    #: ``UPDATE ... RETURNING`` exists: a claim leases in one statement (lease.ReturningLease)
    #: and finalize and settle read what they changed (release.ReturningWrites); without
    #: it, a claim picks then leases (lease.PickThenLease), and they lock then read
    #: (release.LockedWrites)
    returning: ClassVar[bool] = True

    def round_kind(self, routines: bool) -> str:
        """The tick loop's round strategy, by its name in ``worker.loop.ROUNDS`` (see
        worker/rounds.py); ``routines``: the one-call finalize routines are installed."""
        return "parallel"

    def materialized(self, cte: CTE) -> CTE:
        """``cte`` computed once before the statement that reads it, where the dialect can
        be told so (it then keeps its own plan: an index scan)."""
        return cte

    async def upgrade_live_key(self, conn: AsyncConnection, ux: Any) -> None:
        """Schema v4: make ``live_key`` unique through the index ``ux`` instead of a UNIQUE
        constraint on the column (see migrate._v3_to_v4). Default: keep the constraint."""

    #: whether a locking pick's SKIP LOCKED also passes over rows another claim's pick only
    #: read on its way (InnoDB keeps the record lock of a row the WHERE then rejected: a
    #: worker serving type "b" is skipped past a "b" job that a claim for "a" scanned);
    #: then a claim that leased nothing looks whether it was passed over (Claimer.passed_over)
    skip_locked_passes_unmatched: ClassVar[bool] = False

    #: whether the dialect builds partial indexes (see partial_indexes)
    has_partial_indexes: ClassVar[bool] = True

    def partial_indexes(self) -> bool:
        """Whether the dialect builds partial indexes (migrations rebuild them)."""
        return self.has_partial_indexes

    @staticmethod
    def check_shared(url: URL) -> None:
        """Raise ConfigurationError if ``url`` names a database that other processes (the
        workers) cannot share."""

    def prepare_engine(self, engine: AsyncEngine) -> AsyncEngine:
        """Install hooks / options on ``engine``; returns the engine the queue should use."""
        return engine

    async def check_server(self, conn: AsyncConnection) -> None:
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

    def pick_groups(self, pick: Callable[[Any, Any], Select[Any]], k: int
                    ) -> tuple[Any, Callable[[list[str], list[int]], dict[str, Any]]]:
        """One SELECT of what ``pick(group, n)`` selects (SKIP LOCKED) for each of ``k``
        groups, so a claim over many groups is one statement; and how to bind it for
        (groups, counts). Default: a UNION ALL of ``k`` parenthesized parts."""
        parts = [self.skip_locked(pick(bindparam(f"g{i}", type_=String()),
                                       bindparam(f"n{i}", type_=Integer())))
                 for i in range(k)]
        return union_all(*parts), _numbered

    def key_after(self, state_col: Any, state: Any, key_col: Any, bound: Any) -> Any:
        """``key_col > bound`` among rows of ``state``, written so that a scan of an index
        on (state, key, ...) starts at (state, bound) (the census's loose scan)."""
        return key_col > bound

    def key_before(self, state_col: Any, state: Any, key_col: Any, bound: Any) -> Any:
        """``key_col < bound`` among rows of ``state``, written as key_after is (a backward
        scan of the index starts at (state, bound))."""
        return key_col < bound

    def group_scan(self, state_col: Any, state: Any, key_col: Any, from_start: bool
                   ) -> Select[Any] | None:
        """Where the database has a loose index scan of its own: a SELECT of (g, n) for
        the next ``:lim`` distinct ``key_col`` values among rows of ``state`` after
        ``:after`` (unless ``from_start``), n > 0; None: the census's recursive CTE."""
        return None

    def key_is(self, state_col: Any, state: Any, key_col: Any, value: Any) -> Any:
        """``key_col = value`` among rows of ``state``, written as key_after is."""
        return key_col == value

    def pick_each(self, keys: Any, pick: Callable[[Any], Select[Any]]) -> Select[Any] | None:
        """The ids ``pick(keys.c.g)`` selects (SKIP LOCKED) for each row of the sub-select
        ``keys``, as one SELECT; None where the dialect cannot join a row to a limited
        sub-select (no LATERAL)."""
        return None

    def fair_pick_sql(self, with_after: bool) -> str | None:
        """Where the dialect can, the SELECT of (id, running, complete, nseen) that does a
        claim's census, fair share split and picks in one statement (lease_stmts.fair_pick_stmt:
        the ready jobs to lease, FOR UPDATE SKIP LOCKED; ``running``: what the job's group
        ran; ``complete``: every group with ready jobs was read; ``nseen``: how many were),
        with the binds ``:free``, ``:lim``, ``:types`` and, ``with_after``, ``:after``; else
        None."""
        return None

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

    async def begin_write(self, conn: AsyncConnection) -> None:
        """Before an insert on a caller's connection reads anything: make the caller's
        transaction hold what a write transaction of the queue's own would (no-op where the
        insert's row locks already keep what it reads true until commit)."""

    async def insert_ignore(
        self, conn: AsyncConnection, table: Table, rows: list[dict[str, Any]]
    ) -> None:
        """Insert rows, silently skipping those whose primary key already exists."""
        await conn.execute(self.insert_ignore_stmt(table), rows)

    @abstractmethod
    def insert_ignore_stmt(self, table: Table) -> Any:
        """An INSERT into ``table`` that skips rows whose primary key already exists."""

    def read_only(self, conn: AsyncConnection) -> Awaitable[AsyncConnection] | None:
        """Execution options for a read-only transaction, where the dialect cares (SQLite)."""
        return None

    async def notify(self, conn: AsyncConnection, payload: str = "") -> None:
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
        release their dependents in one call (see finalize.finish_in_one_call), or None
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

    def is_rollback(self, exc: BaseException) -> bool:
        """The database refused the transaction (a deadlock, a lock wait that timed out)
        and nothing of it committed: running it again is safe even where a lost commit
        answer would not be (a finalize). Never a lost connection."""
        return False

    async def release(self) -> None:
        """Give back what the dialect holds between calls (JobQueue.close)."""

    def side_writer(self, engine: AsyncEngine) -> Engine | None:
        """A synchronous engine on the same database, for write transactions that must run
        to their end without the event loop (Database.write_sync), or None: they run on
        ``engine`` like any other."""
        return None

    @classmethod
    def sync_engine(cls, url: URL, pool_size: int, **kwargs: Any) -> Engine:
        """A sync engine on ``url`` (a sync driver's) as aiojobqueue connects: the URL
        adjustments and engine keywords of the async one (``kwargs`` win), ``pool_size``
        connections and no overflow (SyncQueue's enqueue path)."""
        from sqlalchemy import create_engine

        with driver_needed(url, sync=True):
            return create_engine(cls.normalize_url(url), pool_size=pool_size,
                                 max_overflow=0, **{**cls.engine_kwargs(), **kwargs})

    def sync_driver_sql(self, sql: str, params: Any, driver: str) -> tuple[str, Any]:
        """``sql`` written for this dialect's async driver (the bulk statements), with its
        ``params``, as the sync ``driver`` (SQLAlchemy's name: psycopg, pymysql…) takes them
        (SyncQueue's inserts). The same wherever both drivers share a parameter style."""
        return sql, params

    def json_param(self, name: str) -> Any:
        """A bind parameter for a JSON column that takes already encoded JSON text."""
        return bindparam(name, type_=Text())


def _numbered(groups: list[str], ns: list[int]) -> dict[str, Any]:
    """The parameters of DialectOps.pick_groups' default statement."""
    out: dict[str, Any] = {f"g{i}": g for i, g in enumerate(groups)}
    out.update({f"n{i}": n for i, n in enumerate(ns)})
    return out

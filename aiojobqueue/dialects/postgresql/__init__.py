"""PostgreSQL: one UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING,
LISTEN/NOTIFY on a dedicated connection outside the pool to wake idle workers (listener.py),
the one-call finalize routines (routines.py and the .sql files beside it), the bulk insert
(insert.py), and what a transaction pooler such as PgBouncer needs (pooler.py)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

from sqlalchemy import (
    CTE,
    BigInteger,
    Engine,
    Integer,
    Select,
    String,
    Text,
    and_,
    any_,
    bindparam,
    cast,
    event,
    func,
    literal,
    select,
    true,
    tuple_,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ...errors import ConfigurationError
from ...schema import Tables
from ..base import DialectOps, Listener
from ..bulk import InsertPath
from . import routines
from .insert import PgInsert, PgInsertPath
from .listener import PROBE_WAIT, Deafness, PgListener
from .pooler import (
    POOLED_CONNECT_ARGS,
    no_prepare_behind_a_pooler,
    pooler_connect_args,
    refuse_caching_engine,
)

__all__ = ["POOLED_CONNECT_ARGS", "PROBE_WAIT", "PostgresOps"]

# deadlock, serialization failure, lock timeout, admin shutdown, cannot connect now
#: an asyncpg parameter ($1) in the dialect's own SQL (PostgresOps.sync_driver_sql)
_DOLLAR = re.compile(r"\$(\d+)")
_TRANSIENT = {"40P01", "40001", "55P03", "57P01", "57P02", "57P03", "08000", "08003", "08006"}


class PostgresOps(PgInsert, DialectOps):
    name = "postgresql"
    async_scheme = "postgresql+asyncpg"
    sync_scheme = "postgresql+psycopg"

    def __init__(self, tables: Tables) -> None:
        super().__init__(tables)
        self._deaf = Deafness()

    @staticmethod
    async def connect_args(url: URL) -> dict[str, Any]:
        return await pooler_connect_args(url)

    @classmethod
    def sync_engine(cls, url: URL, pool_size: int, **kwargs: Any) -> Engine:
        engine = super().sync_engine(url, pool_size, **kwargs)
        if url.get_driver_name() == "psycopg":
            event.listen(engine, "connect", no_prepare_behind_a_pooler)
        return engine

    @staticmethod
    def parse_listen_url(url: URL) -> URL:
        if url.get_backend_name() not in ("postgresql", "postgres"):
            raise ConfigurationError(
                f"listen_url must be a PostgreSQL URL (LISTEN/NOTIFY): {url.drivername!r}")
        if url.drivername in ("postgresql", "postgres"):
            return url.set(drivername="postgresql+asyncpg")
        return url

    async def check_server(self, conn: AsyncConnection) -> None:
        # behind a pooler, an engine that keeps prepared statements fails at random later
        await refuse_caching_engine(conn)

    def round_kind(self, routines: bool) -> str:
        # Atomic statements in autocommit; with the routines, a success is one call that
        # settles too, the claim riding along at a DAG step (see worker/pg_rounds.py).
        return "routine" if routines else "autocommit"

    def insert_path(self) -> InsertPath:
        return PgInsertPath(self)

    def materialized(self, cte: CTE) -> CTE:
        # MATERIALIZED: the edge look-up stays an index scan on depends_on_id; grouped in
        # line, the generic plan may walk the whole deps key when it is skewed.
        return cte.prefix_with("MATERIALIZED")

    async def upgrade_live_key(self, conn: AsyncConnection, ux: Any) -> None:
        """The old constraint, found in the catalog by its one column (whatever its name),
        is dropped and the index built in one transaction, so no other session ever sees
        the table with neither. The drop goes first: it takes the table's exclusive lock
        at once instead of upgrading to it from the build's SHARE lock (an upgrade
        deadlocks with a session that read the table and then writes to it). Writes to the
        jobs table wait while the index is built (one scan; only live keyed jobs get an
        entry)."""
        from sqlalchemy import text

        quote = conn.dialect.identifier_preparer.quote
        table = conn.dialect.identifier_preparer.format_table(ux.table)
        old = (await conn.execute(text("""
            SELECT c.conname FROM pg_constraint c
            JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
            WHERE c.conrelid = to_regclass(:t) AND c.contype = 'u'
              AND cardinality(c.conkey) = 1 AND a.attname = 'live_key'"""),
            {"t": table})).scalars().all()
        for name in old:
            await conn.execute(text(f"ALTER TABLE {table} DROP CONSTRAINT {quote(name)}"))
        await conn.run_sync(ux.create, checkfirst=True)

    def insert_ignore_stmt(self, table: Any) -> Any:
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

    def pick_groups(self, pick: Callable[[Any, Any], Select[Any]], k: int
                    ) -> tuple[Any, Callable[[list[str], list[int]], dict[str, Any]]]:
        # One statement whatever k: the groups and counts as two arrays, each group's
        # pick a LATERAL sub-select (FOR UPDATE is not allowed in a UNION's parts)
        want = func.unnest(
            bindparam("gs", type_=ARRAY(String)), bindparam("ns", type_=ARRAY(Integer)),
        ).table_valued("g", "n").render_derived(name="w")
        lat = self.skip_locked(pick(want.c.g, want.c.n)).lateral("p")
        stmt = select(*lat.c).select_from(want.join(lat, true()))
        return stmt, lambda groups, ns: {"gs": groups, "ns": ns}

    def key_after(self, state_col: Any, state: Any, key_col: Any, bound: Any) -> Any:
        # As a row comparison: a plain "state = 'ready'" is implied by ix_ready's predicate,
        # so the planner drops it from the index condition, and "group_key > x" alone on
        # the index's second column scans it from its first entry (O(ready jobs) a step)
        return tuple_(state_col, key_col) > tuple_(state, bound)

    def key_before(self, state_col: Any, state: Any, key_col: Any, bound: Any) -> Any:
        return tuple_(state_col, key_col) < tuple_(state, bound)  # (see key_after)

    def key_is(self, state_col: Any, state: Any, key_col: Any, value: Any) -> Any:
        # (see key_after) both bounds as row comparisons, the equality kept for the order
        row, at = tuple_(state_col, key_col), tuple_(state, value)
        return and_(key_col == value, row >= at, row <= at)

    def pick_each(self, keys: Any, pick: Callable[[Any], Select[Any]]) -> Select[Any] | None:
        lat = self.skip_locked(pick(keys.c.g)).lateral("p")
        return select(lat.c.id).select_from(keys.join(lat, true()))

    def fair_pick_sql(self, with_after: bool) -> str | None:
        return routines.fair_pick_sql(self.t.jobs.name, with_after)

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


    def settle_routine(
        self, finish: Callable[[Any, Any, Any, Any], Any], release: Callable[[Any], Any],
        activate: Callable[[Any], Any], lease: Callable[[Any, Any, Any, Any, Any], Any],
        release_one: Callable[[Any], Any] | None = None, split: int = 0, part: int = 256,
    ) -> tuple[str, list[str]]:
        """See routines.py."""
        return routines.settle_routine(self.t, self.channel(), finish, release, activate,
                                       lease, release_one, split, part)

    def settle_calls(self, name: str) -> tuple[Any, Any, Any]:
        return routines.settle_calls(name, self.json_param)

    async def routine_exists(self, conn: AsyncConnection, name: str) -> bool:
        return await routines.routine_exists(conn, name)

    def listener(self, engine: AsyncEngine) -> Listener:
        return PgListener(engine, self.channel(), self.listen_url, self._deaf)

    def is_rollback(self, exc: BaseException) -> bool:
        # deadlock, serialization failure, lock not available: the transaction is aborted
        if isinstance(exc, DBAPIError):
            code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
            return code in ("40P01", "40001", "55P03")
        return False

    def _is_transient(self, exc: BaseException) -> bool:
        if isinstance(exc, DBAPIError):
            code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
            if code in _TRANSIENT:
                return True
            cause = exc.orig.__cause__ if exc.orig is not None else None
            name = type(cause).__name__ if cause is not None else ""
            return "Connection" in name or "CannotConnect" in name
        return False

    def sync_driver_sql(self, sql: str, params: Any, driver: str) -> tuple[str, Any]:
        # asyncpg numbers its parameters ($1, one may appear twice); psycopg and psycopg2
        # take them in order (a literal % doubled), psycopg (3) as %b: binary, like asyncpg
        # (in text, each string of an array is escaped by a regex: a third of a batch's time)
        key = (sql, driver)
        done = self._sync_sql.get(key)
        if done is None:
            order: list[int] = []
            mark = "%b" if driver == "psycopg" else "%s"

            def positional(m: re.Match[str]) -> str:
                order.append(int(m.group(1)) - 1)
                return mark

            text = _DOLLAR.sub(positional, sql.replace("%", "%%"))
            done = self._sync_sql[key] = (text, tuple(order))
        values = params or ()
        return done[0], tuple(values[i] for i in done[1])

    @cached_property
    def _sync_sql(self) -> dict[tuple[str, str], tuple[str, tuple[int, ...]]]:
        """sync_driver_sql's translations (the dialect's few statement shapes)."""
        return {}

    def json_param(self, name: str) -> Any:
        return cast(bindparam(name, type_=Text()), JSONB)

    # (column, array type) in the order of the statement's parameters

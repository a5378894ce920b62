"""PostgreSQL's bulk insert: one statement whatever the count (arrays, unnested), and a lone
enqueue straight on a pooled asyncpg link in autocommit (one round trip)."""

from __future__ import annotations

import asyncio
from functools import cached_property
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.util import greenlet_spawn

from ..bulk import InsertPath, JobColumns, varying_fields


class PgInsert:
    """The bulk-insert half of PostgresOps (a mixin: it needs ``t`` and ``channel()``)."""

    t: Any
    channel: Any  # DialectOps.channel
    sync_driver_sql: Any  # PostgresOps.sync_driver_sql

    _BULK = (
        ("type", "text"), ("kind", "text"), ("state", "text"), ("args", "text"),
        ("parent_id", "int8"), ("group_key", "text"), ("weight", "int4"), ("priority", "int4"),
        ("pending", "int4"), ("max_attempts", "int4"), ("timeout", "float8"), ("key", "text"),
        ("cancelled_by", "int8"), ("has_dependents", "bool"), ("error", "text"),
        ("delay", "float8"), ("run_at", "timestamptz"), ("dead", "bool"), ("trace", "text"),
    )

    async def insert_jobs_alone(
        self, engine: AsyncEngine, cols: JobColumns, wake: bool
    ) -> list[int]:
        """The bulk statement straight on a pooled connection's asyncpg link: a lone enqueue()
        is one round trip, and SQLAlchemy's Connection (checkout events, execution context,
        result wrapping: more CPU than the statement itself) is skipped, and with it the
        engine's cursor events. No transaction is ever open on that link, so the statement
        commits by itself; errors come out as SQLAlchemy would raise them.

        The link is kept as a spare for the next lone enqueue (a pool checkout and checkin
        cost about as much CPU as the statement): it goes back to the pool after SPARE_IDLE
        seconds without one, on release(), or at once if it failed. Concurrent callers
        check out their own."""
        sql, params = self._bulk_statement(cols, wake)
        fairy, self._spare = self._spare, None
        if fairy is None:
            fairy = await engine.raw_connection()
        apg: Any = fairy.driver_connection
        for _ in range(3):  # a link the server already closed: nothing sent yet, take another
            if not apg.is_closed():
                break
            await greenlet_spawn(fairy.invalidate)
            await greenlet_spawn(fairy.close)
            fairy = await engine.raw_connection()
            apg = fairy.driver_connection
        try:
            row = await apg.fetchrow(sql, *params)
        except Exception as exc:
            try:
                wrapped = await self._wrap_error(fairy, engine, exc, sql, params)
            finally:
                await greenlet_spawn(fairy.close)
            if wrapped is exc:
                raise
            raise wrapped from exc
        except BaseException:  # cancelled mid-statement: the link's state is unknown
            await greenlet_spawn(fairy.invalidate)
            await greenlet_spawn(fairy.close)
            raise
        if self._spare is None:
            self._keep_spare(fairy)
        else:  # another caller's link is the spare already
            await greenlet_spawn(fairy.close)
        return list(row[0])

    def insert_jobs_alone_sync(self, engine: Engine, cols: JobColumns, wake: bool) -> list[int]:
        """insert_jobs_alone for SyncQueue: the bulk statement on a pooled sync driver
        connection (psycopg, psycopg2) of an engine in autocommit, through its DBAPI cursor:
        SQLAlchemy's Connection would cost a third of the enqueue rate. Errors come out as
        SQLAlchemy would raise them."""
        sql, params = self.sync_driver_sql(*self._bulk_statement(cols, wake),
                                           engine.dialect.driver)
        fairy = engine.raw_connection()
        try:
            cur = fairy.cursor()
            try:
                cur.execute(sql, params)
                row = cur.fetchone()
            finally:
                cur.close()
        except Exception as exc:
            dialect: Any = engine.dialect
            is_db = isinstance(exc, dialect.loaded_dbapi.Error)
            dead = is_db and dialect.is_disconnect(exc, fairy.dbapi_connection, None)
            if dead:
                fairy.invalidate(exc)
            fairy.close()
            if not is_db:
                raise
            raise DBAPIError.instance(
                sql, params, exc, dialect.loaded_dbapi.Error, connection_invalidated=dead,
                dialect=dialect) from exc
        fairy.close()
        assert row is not None  # (INSERT ... RETURNING: one row)
        return list(row[0])

    #: seconds a spare link of insert_jobs_alone stays out of the pool unused
    SPARE_IDLE = 0.5
    _spare: Any = None
    _spare_used = 0.0
    _spare_timer: asyncio.TimerHandle | None = None

    @cached_property
    def _closing(self) -> set[asyncio.Task[Any]]:
        """Spare links being given back by the idle timer (held: tasks are weakly kept)."""
        return set()

    def _keep_spare(self, fairy: Any) -> None:
        loop = asyncio.get_running_loop()
        self._spare, self._spare_used = fairy, loop.time()
        if self._spare_timer is None:
            self._spare_timer = loop.call_later(self.SPARE_IDLE, self._spare_idle)

    def _spare_idle(self) -> None:
        self._spare_timer = None
        if self._spare is None:
            return
        loop = asyncio.get_running_loop()
        left = self._spare_used + self.SPARE_IDLE - loop.time()
        if left > 0:  # used since: look again later
            self._spare_timer = loop.call_later(left, self._spare_idle)
            return
        fairy, self._spare = self._spare, None
        task = loop.create_task(greenlet_spawn(fairy.close))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def release(self) -> None:
        if self._spare_timer is not None:
            self._spare_timer.cancel()
            self._spare_timer = None
        fairy, self._spare = self._spare, None
        if fairy is not None:
            await greenlet_spawn(fairy.close)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    @staticmethod
    async def _wrap_error(
        fairy: Any, engine: AsyncEngine, exc: Exception, sql: str, params: Any
    ) -> Exception:
        """What SQLAlchemy would have raised for ``exc``: a driver error translated to its
        DBAPI class and wrapped in sqlalchemy.exc.DBAPIError; a dead link invalidated."""
        dialect: Any = engine.dialect
        try:
            fairy.dbapi_connection._handle_exception(exc)  # always raises, translated
        except Exception as translated:
            dbapi_exc = translated
        is_db = isinstance(dbapi_exc, dialect.loaded_dbapi.Error)
        dead = fairy.driver_connection.is_closed() or (
            is_db and dialect.is_disconnect(dbapi_exc, fairy.dbapi_connection, None))
        if dead:
            await greenlet_spawn(fairy.invalidate, dbapi_exc)
        if not is_db:
            return dbapi_exc  # not a database error: as it is
        wrapped: Exception = DBAPIError.instance(
            sql, params, dbapi_exc, dialect.loaded_dbapi.Error,
            connection_invalidated=dead, dialect=dialect)
        return wrapped

    def _bulk_statement(self, cols: JobColumns, wake: bool) -> tuple[str, tuple[Any, ...]]:
        varying = varying_fields(cols)  # one row: none (all scalars, a plain INSERT)
        sql = self._bulk_sql.get(varying)
        if sql is None:
            sql = self._bulk_sql[varying] = self._bulk_insert_sql(varying)
        params = (*(cols[name] if name in varying else cols[name][0] for name, _ in self._BULK),
                  wake, self.channel())
        return sql, params

    async def insert_jobs(self, conn: AsyncConnection, cols: JobColumns, wake: bool) -> list[int]:
        """One statement whatever the count: the fields that vary are bound as arrays and
        unnested, the ones equal on every row (most of them in a bulk load) as one value,
        so encoding is per array, not per row. Ids are drawn from the sequence in input
        order (WITH ORDINALITY, the CTE materialized so nextval runs once per row) and
        handed back as one array."""
        sql, params = self._driver_sql(conn, *self._bulk_statement(cols, wake))
        row = (await conn.exec_driver_sql(sql, params)).one()
        return list(row[0])

    def _driver_sql(self, conn: AsyncConnection, sql: str, params: Any) -> tuple[str, Any]:
        """The dialect's own SQL ($1 parameters, asyncpg's) for the connection's driver
        (SyncQueue's stand-in connection, syncbridge.SyncConnection, translates itself)."""
        driver = conn.dialect.driver
        if driver == "asyncpg" or not isinstance(conn, AsyncConnection):
            return sql, params
        done: tuple[str, Any] = self.sync_driver_sql(sql, params, driver)
        return done

    async def insert_edges(
        self, conn: AsyncConnection, job_ids: list[int], up_ids: list[int]
    ) -> None:
        """All of a batch's edges in one statement: two arrays, unnested."""
        await conn.exec_driver_sql(*self._driver_sql(
            conn, f'INSERT INTO "{self.t.deps.name}" (job_id, depends_on_id) '
            "SELECT * FROM unnest($1::bigint[], $2::bigint[])", (job_ids, up_ids)))

    @cached_property
    def _bulk_sql(self) -> dict[frozenset[str], str]:
        """The bulk INSERT by set of varying fields (a few shapes in practice; the driver
        prepares each once)."""
        return {}

    def _bulk_insert_sql(self, varying: frozenset[str]) -> str:
        table = f'"{self.t.jobs.name}"'  # quoted: a prefix may have capitals
        field: dict[str, str] = {}  # field -> SQL: a column of `input` or a parameter
        arrays, names = [], []
        for i, (name, typ) in enumerate(self._BULK, 1):
            if name in varying:
                arrays.append(f"${i}::{typ}[]")
                names.append(name)
                field[name] = name
            else:
                field[name] = f"${i}::{typ}"
        wake, channel = len(self._BULK) + 1, len(self._BULK) + 2
        f, now = field, "statement_timestamp()"
        columns = """type, kind, state, args, parent_id, group_key, weight, priority,
        pending, run_after, attempts, max_attempts, attempt_limit, timeout, key, live_key,
        cancelled_by, has_dependents, error, created_at, finished_at, trace"""
        values = f"""{f["type"]}, {f["kind"]}, {f["state"]}, {f["args"]}::jsonb, {f["parent_id"]},
        {f["group_key"]}, {f["weight"]}, {f["priority"]}, {f["pending"]},
        COALESCE({f["run_at"]}, {now} + make_interval(secs => {f["delay"]})), 0,
        {f["max_attempts"]}, {f["max_attempts"]}, {f["timeout"]}, {f["key"]},
        CASE WHEN {f["dead"]} THEN NULL ELSE {f["key"]} END, {f["cancelled_by"]},
        {f["has_dependents"]}, {f["error"]}::jsonb, {now},
        CASE WHEN {f["dead"]} THEN {now} END, {f["trace"]}::jsonb"""
        notify = f"CASE WHEN ${wake}::bool THEN pg_notify(${channel}, '') END"
        if not varying:  # one row: a plain INSERT (less for the server to plan and run)
            return f"""
INSERT INTO {table} ({columns})
VALUES ({values})
RETURNING ARRAY[id], {notify}"""
        return f"""
WITH input AS MATERIALIZED (
    SELECT nextval((SELECT pg_get_serial_sequence('{table}', 'id'))) AS id, u.*
    FROM unnest({", ".join(arrays)}) WITH ORDINALITY AS u({", ".join(names)}, ord)
), ins AS (
    INSERT INTO {table} (id, {columns})
    SELECT id, {values}
    FROM input
)
SELECT array_agg(id ORDER BY ord), {notify}
FROM input"""


class PgInsertPath(InsertPath):
    """InsertPath with the lone enqueue in autocommit (PgInsert.insert_jobs_alone) on
    asyncpg; on psycopg a lone enqueue is a transaction like any other."""

    def __init__(self, ops: Any) -> None:
        super().__init__(ops)
        if ops.driver != "psycopg":
            self.alone = ops.insert_jobs_alone
        self.alone_sync = ops.insert_jobs_alone_sync

"""MySQL 8+ and MariaDB 10.6+: SELECT ... FOR UPDATE SKIP LOCKED, then UPDATE, under READ COMMITTED.

READ COMMITTED because under REPEATABLE READ gap locks stall producers once a claim scans to
the end of the ready range, and snapshot checks raise 1020 on newer MariaDB. UPDATE has no
RETURNING here, so the claim reads the rows it locked before updating them.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

from sqlalchemy import (
    Integer,
    Select,
    String,
    Table,
    bindparam,
    event,
    insert,
    literal_column,
    select,
    text,
    update,
)
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import PoolResetState

from ..errors import UnsupportedDatabaseError
from ..schema import LIVE, TERMINAL
from .base import DialectOps, Listener
from .bulk import (
    JOB_FIELDS,
    ROWS_CHUNK,
    InsertPath,
    JobColumns,
    json_rows_params,
    run_bulk_insert,
    varying_fields,
)
from .columns import NAME_LEN
from .mysql_bell import ring
from .mysql_watch import BellWatch


def _reset_open_transaction(dbapi_conn: Any, record: Any, state: PoolResetState) -> None:
    """A connection going back to the pool: roll back only a transaction the server says is
    open (its OK packets carry the flag). A block that committed left none, so this saves
    the ROLLBACK round trip that the pool's own reset (off for engines aiojobqueue builds:
    engine_kwargs) sends after every COMMIT; on an engine of the user's own, whose pool
    still resets, this adds nothing after a COMMIT."""
    if state.terminate_only or not state.asyncio_safe:
        return  # closed, not reused (or outside the event loop: the pool closes it)
    driver = getattr(record, "driver_connection", None)
    in_transaction = getattr(driver, "get_transaction_status", None)
    if in_transaction is None or in_transaction():
        dbapi_conn.rollback()


# deadlock, lock wait timeout, snapshot conflict, server gone / lost / unreachable
_TRANSIENT = {1213, 1205, 1020, 2006, 2013, 2003, 1927, 4031}


class MySQLOps(DialectOps):
    name = "mysql"
    async_scheme = "mysql+aiomysql"
    sync_scheme = "mysql+pymysql"
    has_partial_indexes = False
    # No UPDATE ... RETURNING: a claim picks, then leases; finalize and settle lock and read.
    returning = False

    @staticmethod
    def engine_kwargs() -> dict[str, Any]:
        # the pool's own reset is a ROLLBACK round trip at every checkin, also after a
        # COMMIT; _reset_open_transaction sends one only where a transaction is open
        return {"isolation_level": "READ COMMITTED", "pool_recycle": 3600,
                "pool_reset_on_return": None}

    @staticmethod
    def normalize_url(url: URL) -> URL:
        # utf8mb4: the driver's default utf8 (3 bytes) cannot hold every JSON string
        if "charset" not in url.query:
            return url.update_query_dict({"charset": "utf8mb4"})
        return url

    def insert_path(self) -> InsertPath:
        return MySQLInsertPath(self)

    async def upgrade_live_key(self, conn: AsyncConnection, ux: Any) -> None:
        """One ALTER TABLE swaps the old unique key (named after the column, found in
        information_schema) for the new one, which is not partial here (InnoDB's unique
        index allows any number of NULLs): the same rule, renamed so that the database
        matches the metadata (Alembic). DDL commits implicitly here, which lets go of the
        gate too: a process that takes it next and still sees the old key fails its ALTER
        and upgrade() tries again, finding v4."""
        J = ux.table
        quote = conn.dialect.identifier_preparer.quote
        table = conn.dialect.identifier_preparer.format_table(J)
        have = (await conn.execute(text("""
            SELECT INDEX_NAME FROM information_schema.STATISTICS
            WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = :t AND NON_UNIQUE = 0
            GROUP BY INDEX_NAME
            HAVING COUNT(*) = 1 AND MAX(COLUMN_NAME) = 'live_key'"""),
            {"t": J.name})).scalars().all()
        changes = [f"DROP INDEX {quote(name)}" for name in have if name != ux.name]
        if ux.name not in have:
            changes.append(f"ADD UNIQUE INDEX {quote(str(ux.name))} (live_key)")
        if changes:
            await conn.execute(text(f"ALTER TABLE {table} {', '.join(changes)}"))

    def prepare_engine(self, engine: AsyncEngine) -> AsyncEngine:
        if not event.contains(engine.sync_engine.pool, "reset", _reset_open_transaction):
            event.listen(engine.sync_engine.pool, "reset", _reset_open_transaction)
        # create_engine(isolation_level=...) lands in _on_connect_isolation_level; checking only
        # `isolation_level` (always None) re-set the level on EVERY checkout: an extra round
        # trip, and a raw pymysql error (not wrapped by SQLAlchemy) when the link is dead.
        level = getattr(engine.dialect, "_on_connect_isolation_level", None) or getattr(
            engine.dialect, "isolation_level", None)
        if level != "READ COMMITTED":
            return engine.execution_options(isolation_level="READ COMMITTED")
        return engine

    async def check_server(self, conn: AsyncConnection) -> None:
        dialect = conn.dialect
        version = tuple(v for v in (dialect.server_version_info or ()) if isinstance(v, int))
        if getattr(dialect, "is_mariadb", False):
            if tuple(version[:2]) < (10, 6):
                raise UnsupportedDatabaseError(
                    f"MariaDB {version} lacks SKIP LOCKED: aiojobqueue needs MariaDB 10.6+"
                )
        elif tuple(version[:3]) < (8, 0, 1):
            raise UnsupportedDatabaseError(
                f"MySQL {version} lacks SKIP LOCKED: aiojobqueue needs MySQL 8.0.1+"
            )

    def insert_ignore_stmt(self, table: Any) -> Any:
        return insert(table).prefix_with("IGNORE")

    def group_scan(self, state_col: Any, state: Any, key_col: Any, from_start: bool
                   ) -> Select[Any] | None:
        # GROUP BY on the index's prefix: MariaDB 10.11 reads it as a ref on state, entry
        # by entry (no "Using index for group-by", ANALYZE'd or not), so it costs the ready
        # jobs of the groups it returns and stops after :lim groups; the recursive CTE's
        # correlated "next key after g" is worse (a ref on state from the first entry at
        # every step). Claimer._still_alone spares a busy fleet this read where it can.
        stmt = select(key_col.label("g"), literal_column("1").label("n")).where(
            state_col == state)
        if not from_start:
            stmt = stmt.where(key_col > bindparam("after", type_=String()))
        return stmt.group_by(key_col).order_by(key_col).limit(
            bindparam("lim", type_=Integer()))

    skip_locked_passes_unmatched = True

    def skip_locked(self, stmt: Select[Any]) -> Select[Any]:
        return stmt.with_for_update(skip_locked=True)  # exclusive: never read=True (SA #10134)

    def for_update(self, stmt: Select[Any]) -> Select[Any]:
        return stmt.with_for_update()

    # -- wake-up: the doorbell in meta, KILL QUERY (mysql_bell.py, mysql_watch.py) ---------
    async def notify(self, conn: AsyncConnection, payload: str = "") -> None:
        ring(conn, self.t.meta.name)

    def listener(self, engine: AsyncEngine) -> Listener | None:
        return BellWatch(engine, self.t.meta.name)

    def _is_transient(self, exc: BaseException) -> bool:
        if isinstance(exc, DBAPIError):
            args: tuple[Any, ...] = tuple(getattr(exc.orig, "args", ()))
            return bool(args) and args[0] in _TRANSIENT
        return False

    def is_rollback(self, exc: BaseException) -> bool:
        # deadlock (the server rolled it back), lock wait timeout (the caller rolls back)
        if isinstance(exc, DBAPIError):
            args: tuple[Any, ...] = tuple(getattr(exc.orig, "args", ()))
            return bool(args) and args[0] in (1213, 1205)
        return False

    #: characters of JSON rows per statement: well under the default max_allowed_packet (16 MB)
    MAX_DOCUMENT = 4_000_000
    # JSON_TABLE type of each field (bools travel as 0/1, times as naive UTC text)
    _BULK = {
        "type": f"VARCHAR({NAME_LEN})", "kind": "VARCHAR(10)", "state": "VARCHAR(10)",
        "args": "LONGTEXT", "parent_id": "BIGINT", "group_key": f"VARCHAR({NAME_LEN})",
        "weight": "INT", "priority": "INT", "pending": "INT", "max_attempts": "INT",
        "timeout": "DOUBLE", "key": "VARCHAR(255)", "cancelled_by": "BIGINT",
        "has_dependents": "INT", "error": "LONGTEXT", "delay": "DOUBLE",
        "run_at": "DATETIME(6)", "dead": "INT", "trace": "LONGTEXT",
    }

    async def insert_jobs(
        self, conn: AsyncConnection, cols: JobColumns, wake: bool
    ) -> list[int] | None:
        """MariaDB: one INSERT ... SELECT FROM JSON_TABLE(:rows) ... RETURNING id, the fields
        that vary as one JSON array of rows, the others as one value each. The SELECT is
        ordered by the rows' ordinal and an INSERT ... SELECT takes its auto-increment values
        in that order (as the multi-row INSERT does), so the sorted ids map back in order.
        ``wake`` rings the bell at commit (see mysql_bell.py). MySQL 8 has no INSERT ...
        RETURNING: None (MySQLInsertPath.rows; the caller then calls notify)."""
        if not getattr(conn.dialect, "is_mariadb", False):
            return None
        varying = sorted(varying_fields(cols)) or ["args"]
        sql = self._bulk_sql.get(tuple(varying))
        if sql is None:
            sql = self._bulk_sql[tuple(varying)] = self._bulk_insert_sql(varying)
        enc = dict(cols, run_at=[None if t is None else _naive_utc(t) for t in cols["run_at"]],
                   has_dependents=[int(v) for v in cols["has_dependents"]],
                   dead=[int(v) for v in cols["dead"]])
        params = json_rows_params(enc, varying)
        n = len(cols["args"])
        if len(params["rows"]) > self.MAX_DOCUMENT and n > 1:  # big args: halve the slice
            first = await self.insert_jobs(
                conn, {name: vals[: n // 2] for name, vals in cols.items()}, wake)
            rest = await self.insert_jobs(
                conn, {name: vals[n // 2 :] for name, vals in cols.items()}, False)
            return None if first is None or rest is None else first + rest
        ids = await run_bulk_insert(conn, sql, params, n)
        if wake:
            ring(conn, self.t.meta.name)
        return ids

    @cached_property
    def _bulk_sql(self) -> dict[tuple[str, ...], str]:
        return {}

    def _bulk_insert_sql(self, varying: list[str]) -> str:
        f = {name: f"%({name})s" for name in JOB_FIELDS}
        f.update({name: f"u.c{i}" for i, name in enumerate(varying)})
        columns = ", ".join(
            f"c{i} {self._BULK[name]} PATH '$[{i}]'" for i, name in enumerate(varying))
        now = "UTC_TIMESTAMP(6)"  # one instant per statement
        delay = f"CAST(ROUND({f['delay']} * 1000000) AS SIGNED)"
        return f"""
INSERT INTO `{self.t.jobs.name}` (`type`, `kind`, `state`, `args`, `parent_id`, `group_key`,
    `weight`, `priority`, `pending`, `run_after`, `attempts`, `max_attempts`, `attempt_limit`,
    `timeout`, `key`, `live_key`, `cancelled_by`, `has_dependents`, `error`, `created_at`,
    `finished_at`, `trace`)
SELECT {f["type"]}, {f["kind"]}, {f["state"]}, {f["args"]}, {f["parent_id"]}, {f["group_key"]},
    {f["weight"]}, {f["priority"]}, {f["pending"]},
    COALESCE({f["run_at"]}, DATE_ADD({now}, INTERVAL {delay} MICROSECOND)), 0,
    {f["max_attempts"]}, {f["max_attempts"]}, {f["timeout"]}, {f["key"]},
    CASE WHEN {f["dead"]} THEN NULL ELSE {f["key"]} END, {f["cancelled_by"]},
    {f["has_dependents"]}, {f["error"]}, {now}, CASE WHEN {f["dead"]} THEN {now} END,
    {f["trace"]}
FROM JSON_TABLE(%(rows)s, '$[*]' COLUMNS (ord FOR ORDINALITY, {columns})) AS u
ORDER BY u.ord
RETURNING id"""


def _naive_utc(t: datetime) -> str:
    return t.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")


class TokenInsert(InsertPath):
    """Without INSERT ... RETURNING (MySQL 8): no bulk statement, and the executemany INSERT
    tags its rows with a token to read their ids back. With innodb_autoinc_lock_mode=2 a
    multi-row INSERT's ids are increasing but not guaranteed consecutive, so: tag the rows
    with a token in the (still unused) lease_owner column, read the ids back in id order,
    and clear the tag."""

    async def bulk(self, conn: AsyncConnection, cols: JobColumns, wake: bool) -> list[int] | None:
        return None

    async def rows(self, conn: AsyncConnection, jobs: Table, stmt: Any,
                   params: list[dict[str, Any]], extra: list[Any]) -> list[int]:
        J = jobs
        token = f"insert:{uuid.uuid4().hex}"
        ids: list[int] = []
        for c in range(0, len(params), ROWS_CHUNK):
            chunk = [dict(r, lease_owner=token) for r in params[c : c + ROWS_CHUNK]]
            await conn.execute(stmt, chunk)  # executemany: batched multi-row INSERTs
            got = [r[0] for r in await conn.execute(
                select(J.c.id)
                .where(J.c.state.in_(LIVE + TERMINAL), J.c.lease_owner == token)
                .order_by(J.c.id)
            )]
            if len(got) != len(chunk):  # pragma: no cover - would mean a broken id mapping
                raise RuntimeError(f"inserted {len(chunk)} jobs but found {len(got)}")
            await conn.execute(update(J).where(J.c.id.in_(got)).values(lease_owner=None))
            ids += got
        return ids


class MySQLInsertPath(InsertPath):
    """MariaDB: INSERT ... RETURNING (the JSON_TABLE bulk statement, see insert_jobs);
    MySQL 8: the token path (TokenInsert)."""

    async def rows(self, conn: AsyncConnection, jobs: Table, stmt: Any,
                   params: list[dict[str, Any]], extra: list[Any]) -> list[int]:
        if conn.dialect.insert_returning:
            return await super().rows(conn, jobs, stmt, params, extra)
        return await TokenInsert(self.ops).rows(conn, jobs, stmt, params, extra)

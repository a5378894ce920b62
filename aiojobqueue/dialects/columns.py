"""Column types and SQL functions whose storage or spelling differs by dialect: time from
the database clock, stored the same way on every dialect; ids; JSON; and the DDL that goes
with a jobs table (its routines dropped with it on PostgreSQL).

Every lease and run_after is computed by the database (``utcnow_plus``) so workers on several
hosts never compare their own clocks. Storage: ``timestamptz`` on PostgreSQL, ``DATETIME(6)``
holding naive UTC on MySQL/MariaDB, and a REAL of epoch seconds on SQLite (text timestamps
compare wrongly when formats differ).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DDL, JSON, BigInteger, DateTime, Float, Integer, Table, event
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import TextClause
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import TypeDecorator, TypeEngine

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: The longest job type, group or policy name: the width of their columns.
NAME_LEN = 200

#: Primary keys: SQLite only autoincrements INTEGER primary keys.
Id = BigInteger().with_variant(Integer, "sqlite")
#: JSON columns: JSONB on PostgreSQL.
Json = JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every dialect."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(postgresql.TIMESTAMP(timezone=True))
        if dialect.name in ("mysql", "mariadb"):
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        if dialect.name == "sqlite":
            return dialect.type_descriptor(Float())
        return dialect.type_descriptor(DateTime(timezone=True))

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if value is None:
            return None
        if not isinstance(value, datetime):
            raise TypeError(f"expected a datetime, got {type(value).__name__}")
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            return (value - _EPOCH).total_seconds()
        if dialect.name in ("mysql", "mariadb"):
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, (int, float)):
            return datetime.fromtimestamp(float(value), UTC)
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        assert isinstance(value, datetime)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def as_utc(value: Any) -> datetime:
    """A time read through an expression that lost the column's type (MIN over a CASE,
    say), decoded as the column would have been."""
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value
    out = UTCDateTime().process_result_value(value, None)  # type: ignore[arg-type]
    assert out is not None
    return out


class utcnow_plus(FunctionElement[datetime]):
    """The database's current UTC time plus ``seconds`` (a float, may be negative)."""

    type = UTCDateTime()
    inherit_cache = True
    name = "utcnow_plus"


@compiles(utcnow_plus, "postgresql")
def _pg(element: utcnow_plus, compiler: SQLCompiler, **kw: Any) -> str:
    (arg,) = element.clauses
    return f"(statement_timestamp() + make_interval(secs => {compiler.process(arg, **kw)}))"


@compiles(utcnow_plus, "mysql")
@compiles(utcnow_plus, "mariadb")
def _my(element: utcnow_plus, compiler: SQLCompiler, **kw: Any) -> str:
    (arg,) = element.clauses
    # MICROSECOND with an integer: fractional SECOND intervals are not portable across versions.
    return (
        "DATE_ADD(UTC_TIMESTAMP(6), INTERVAL "
        f"CAST(ROUND(({compiler.process(arg, **kw)}) * 1000000) AS SIGNED) MICROSECOND)"
    )


@compiles(utcnow_plus, "sqlite")
def _lite(element: utcnow_plus, compiler: SQLCompiler, **kw: Any) -> str:
    (arg,) = element.clauses
    return f"((julianday('now') - 2440587.5) * 86400.0 + ({compiler.process(arg, **kw)}))"


def db_now() -> utcnow_plus:
    """The database's current UTC time."""
    return utcnow_plus(0.0)


#: the backends that build a partial index; MySQL and MariaDB have none and index every row
#: (``DialectOps.has_partial_indexes`` says the same to the core)
PARTIAL_INDEX_BACKENDS = ("postgresql", "sqlite")


def partial_where(where: TextClause) -> dict[str, Any]:
    """An ``Index``'s keyword arguments that make it partial, ``WHERE where``, on the
    backends that have partial indexes."""
    return {f"{backend}_where": where for backend in PARTIAL_INDEX_BACKENDS}


def builds_partial(ddl: Any, target: Any, bind: Any, tables: Any = None, state: Any = None,
                   *, dialect: Dialect, compiler: Any = None, checkfirst: bool = False) -> bool:
    """Whether the backend at hand builds partial indexes (a ``ddl_if`` test: an index that
    is only worth its writes where it is partial is left out elsewhere)."""
    return dialect.name in PARTIAL_INDEX_BACKENDS


def drop_routines_with(jobs: Table) -> None:
    """The one-call finalize routines (PostgreSQL, see dialects/postgresql) go with the
    table they write: whatever their digest, drop_all() leaves none behind."""
    routines = f"{jobs.name}_settle_"
    drop = DDL(f"""DO $ajq$ DECLARE f regprocedure; BEGIN
  FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
           WHERE p.pronamespace = current_schema()::regnamespace
             AND left(p.proname, {len(routines)}) = '{routines}'
  LOOP EXECUTE 'DROP FUNCTION ' || f; END LOOP;
END $ajq$""")  # type: ignore[no-untyped-call]
    event.listen(jobs, "before_drop", drop.execute_if(dialect="postgresql"))

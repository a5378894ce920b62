"""MySQL 8+ and MariaDB 10.6+: SELECT ... FOR UPDATE SKIP LOCKED, then UPDATE, under READ COMMITTED.

READ COMMITTED because under REPEATABLE READ gap locks stall producers once a claim scans to
the end of the ready range, and snapshot checks raise 1020 on newer MariaDB. UPDATE has no
RETURNING here, so the claim reads the rows it locked before updating them.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ..errors import UnsupportedDatabaseError
from .base import DialectOps

# deadlock, lock wait timeout, snapshot conflict, server gone / lost / unreachable
_TRANSIENT = {1213, 1205, 1020, 2006, 2013, 2003, 1927, 4031}


class MySQLOps(DialectOps):
    name = "mysql"
    update_returning = False

    @staticmethod
    def engine_kwargs() -> dict[str, Any]:
        return {"isolation_level": "READ COMMITTED", "pool_recycle": 3600}

    def prepare_engine(self, engine: AsyncEngine) -> AsyncEngine:
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

    def _insert_ignore(self, table: Any) -> Any:
        return insert(table).prefix_with("IGNORE")

    def skip_locked(self, stmt: Select[Any]) -> Select[Any]:
        return stmt.with_for_update(skip_locked=True)  # exclusive: never read=True (SA #10134)

    def for_update(self, stmt: Select[Any]) -> Select[Any]:
        return stmt.with_for_update()

    def _is_transient(self, exc: BaseException) -> bool:
        if isinstance(exc, DBAPIError):
            args: tuple[Any, ...] = tuple(getattr(exc.orig, "args", ()))
            return bool(args) and args[0] in _TRANSIENT
        return False

"""The database of a Django task backend: its URL from ``DATABASES`` and, for an enqueue
inside ``transaction.atomic()``, a SQLAlchemy ``Connection`` on Django's own DB-API
connection, so the jobs are inserted in Django's transaction (they exist iff it commits).

The SQLAlchemy engine hands out Django's live DB-API connection (``creator``) behind a
proxy whose ``commit``, ``rollback`` and ``close`` do nothing: Django owns the transaction
and the connection's life; SQLAlchemy only runs statements on it."""

from __future__ import annotations

import threading
from typing import Any

from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool

from ...errors import ConfigurationError

#: Django's DB-API module -> the SQLAlchemy dialect that drives it
_DIALECTS = {"sqlite3": "sqlite+pysqlite", "psycopg": "postgresql+psycopg",
             "psycopg2": "postgresql+psycopg2", "MySQLdb": "mysql+mysqldb",
             "pymysql": "mysql+pymysql"}


def url_of(settings_dict: dict[str, Any]) -> str:
    """The SQLAlchemy URL (default drivers) of one ``DATABASES`` entry."""
    engine = str(settings_dict.get("ENGINE", ""))
    name = settings_dict.get("NAME")
    if engine.endswith("sqlite3"):
        if not name or str(name) == ":memory:" or str(name).startswith("file:"):
            raise ConfigurationError(
                "aiojobqueue needs a SQLite database file that worker processes can open, "
                f"not {name!r}")
        return f"sqlite:///{name}"
    kind = ("postgresql" if "postgresql" in engine or "postgis" in engine
            else "mysql" if "mysql" in engine else None)
    if kind is None:
        raise ConfigurationError(
            f"aiojobqueue runs on SQLite, PostgreSQL and MySQL/MariaDB, not {engine!r}")
    port = settings_dict.get("PORT")
    url = URL.create(kind, username=settings_dict.get("USER") or None,
                     password=settings_dict.get("PASSWORD") or None,
                     host=settings_dict.get("HOST") or None,
                     port=int(port) if port else None, database=name or None)
    return url.render_as_string(hide_password=False)


class _Borrowed:
    """Django's DB-API connection, lent to SQLAlchemy: transaction ends and close are
    Django's own business."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)

    def commit(self) -> None:
        pass

    def rollback(self) -> None:
        pass

    def close(self) -> None:
        pass


class DjangoConnections:
    """SQLAlchemy connections on one Django alias's live connection (one engine per DB-API
    module, built on first use)."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self._engines: dict[str, Engine] = {}
        self._lock = threading.Lock()
        self._lent = threading.local()

    def joinable(self) -> bool:
        """Is this thread's connection inside ``transaction.atomic()``? (Outside one, an
        enqueue commits on the queue's own connection at once, as Django's autocommit.)"""
        from django.db import connections

        return bool(connections[self.alias].in_atomic_block)

    def connection(self) -> Connection:
        """A SQLAlchemy Connection on this thread's Django connection, in its transaction.
        Raises ConfigurationError for a driver SQLAlchemy cannot drive."""
        from django.db import connections

        conn = connections[self.alias]
        conn.ensure_connection()
        raw = conn.connection
        module = type(raw).__module__.split(".")[0]
        if module == "sqlite3" or module.startswith("_sqlite"):
            module = "sqlite3"
        dialect = _DIALECTS.get(module)
        if dialect is None:
            raise ConfigurationError(
                f"cannot join Django's transaction on a {module} connection; enqueue in "
                "transaction.on_commit() instead")
        engine = self._engines.get(dialect)
        if engine is None:
            with self._lock:
                engine = self._engines.get(dialect)
                if engine is None:
                    kw: dict[str, Any] = ({"use_native_hstore": False}
                                          if dialect.startswith("postgresql") else {})
                    engine = self._engines[dialect] = create_engine(
                        f"{dialect}://", creator=self._lend, poolclass=NullPool,
                        pool_reset_on_return=None, **kw)
        self._lent.raw = raw
        return engine.connect()

    def _lend(self) -> Any:
        return _Borrowed(self._lent.raw)

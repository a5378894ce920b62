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
from sqlalchemy.pool import NullPool

from ...dialects.borrowed import borrowed_engine_kwargs, dbapi_dialect, django_url
from ...errors import ConfigurationError


def url_of(settings_dict: dict[str, Any]) -> str:
    """The SQLAlchemy URL (default drivers) of one ``DATABASES`` entry."""
    return django_url(settings_dict)


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
        dialect = dbapi_dialect(raw)
        if dialect is None:
            raise ConfigurationError(
                f"cannot join Django's transaction on a {type(raw).__module__} connection; "
                "enqueue in transaction.on_commit() instead")
        engine = self._engines.get(dialect)
        if engine is None:
            with self._lock:
                engine = self._engines.get(dialect)
                if engine is None:
                    engine = self._engines[dialect] = create_engine(
                        f"{dialect}://", creator=self._lend, poolclass=NullPool,
                        pool_reset_on_return=None, **borrowed_engine_kwargs(dialect))
        self._lent.raw = raw
        return engine.connect()

    def _lend(self) -> Any:
        return _Borrowed(self._lent.raw)

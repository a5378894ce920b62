"""SyncQueue's inserts, in the caller's thread: the JobQueue's own insert path (insert.py)
driven without an event loop on a sync connection (syncbridge.py), on the caller's
connection or on the SyncQueue's own sync engines, with the same flow as
``Inserter.insert``: a lone plain job as one autocommit statement where the dialect has one,
else one transaction, retried whole on a lock conflict, looked at again on a key race.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from .dialects.urls import sync_ops_for
from .errors import NotStartedError
from .insert import Inserter
from .syncbridge import bridge, drive

T = TypeVar("T")


class SyncInserts:
    """The sync engines a SyncQueue inserts with, and its two insert flows.

    ``inserter()`` gives the started JobQueue's Inserter (its checks, its statements, its
    dialect); the engines are this object's: ``engine`` (``pool_size`` connections) and,
    made on first use, one whose connections are in autocommit from the start (switching a
    pooled one there and back costs more than the lone statement it runs)."""

    def __init__(self, url: str, pool_size: int, inserter: Callable[[], Inserter]) -> None:
        ops, sync = sync_ops_for(url)
        self._sync_url, self._ops_class, self._pool_size = sync, ops, pool_size
        self._inserter = inserter
        #: the engine of the own inserts (shared with the app through SyncQueue.engine)
        self.engine = ops.sync_engine(sync, pool_size)
        self._autocommit: Engine | None = None
        self._lock = threading.Lock()
        self._closed = False

    def on(self, specs: list[Any], connection: Connection | Session) -> list[int]:
        """Insert ``specs`` on the caller's connection, in the caller's thread: the jobs
        exist iff the caller's transaction commits."""
        inserter = self._inserter()
        # (a Connection not yet in a transaction begins one: SQLAlchemy's autobegin)
        conn = connection.connection() if isinstance(connection, Session) else connection
        aconn = bridge(conn, inserter.db.ops)

        async def insert() -> list[int]:
            await inserter.db.ops.begin_write(aconn)
            ids, _ = await inserter.insert_specs(aconn, specs)
            return ids

        return drive(insert())

    def own(self, specs: list[Any]) -> list[int]:
        """Insert ``specs`` on the own engines, as ``Inserter.insert`` does: a lone plain job
        as one statement in autocommit where the dialect has one, else a transaction (a lock
        conflict retries it whole, a race on a key looks again)."""
        inserter = self._inserter()
        db = inserter.db
        if inserter.path.alone_sync is not None and inserter._lone(specs):
            done = inserter.insert_alone_sync(self._autocommit_engine(), specs)
            if done is not None:
                return done[0]
        for attempt in range(3):
            try:
                return self._write(lambda c: drive(inserter.insert_specs(
                    bridge(c, db.ops), specs))[0])
            except IntegrityError:  # a concurrent insert took the same key: look again
                if attempt == 2:
                    raise
                for s in specs:
                    s.ref._id = None
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close the engines' connections (an insert after this raises NotStartedError where
        it would need a new engine)."""
        with self._lock:
            self._closed = True
            autocommit, self._autocommit = self._autocommit, None
        self.engine.dispose()
        if autocommit is not None:
            autocommit.dispose()

    def forked(self) -> None:
        """In a forked child: leave the parent's pooled connections to it (closing them
        would end the parent's sessions); new ones are opened on use."""
        self._lock = threading.Lock()  # (the parent's may have been held at the fork)
        self.engine.dispose(close=False)
        if self._autocommit is not None:
            self._autocommit.dispose(close=False)

    def _autocommit_engine(self) -> Engine:
        engine = self._autocommit
        if engine is None:
            with self._lock:
                if self._closed:
                    raise NotStartedError("this SyncQueue is closed")
                if self._autocommit is None:
                    self._autocommit = self._ops_class.sync_engine(
                        self._sync_url, self._pool_size, isolation_level="AUTOCOMMIT")
                engine = self._autocommit
        return engine

    def _write(self, fn: Callable[[Connection], T], retries: int = 8) -> T:
        """``fn(conn)`` in a transaction of the own engine; a lock conflict or deadlock
        retries it whole after a short jittered backoff (``Database.retrying``'s rule)."""
        db = self._inserter().db
        delay = 0.005
        for attempt in range(retries + 1):
            try:
                with self.engine.begin() as conn:
                    return fn(conn)
            except Exception as exc:
                if attempt == retries or not db.is_conflict(exc):
                    raise
                time.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 1.0)
        raise AssertionError("unreachable")

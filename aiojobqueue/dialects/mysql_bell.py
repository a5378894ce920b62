"""MySQL/MariaDB wake-up: a doorbell counter in ``meta`` that idle workers poll.

The servers have no LISTEN/NOTIFY and no blocking wait another session can end, so an idle
worker reads a tiny marker often instead: the sum of the SHARDS ``wake:N`` rows of the
queue's ``meta`` table (a primary-key range of SHARDS rows: the same cost at 1,000 jobs as
at 1,000,000). Every transaction that makes a job runnable (an enqueue of a ready job, a
release of dependents, a job handed back) calls ``DialectOps.notify``; here that only marks
the connection, and the ``commit`` hook adds one to a random shard just before COMMIT. So:

* a rolled-back transaction rings nothing, and a watcher never sees the bell before the
  rows it announces are committed (they commit together);
* the bell row is the transaction's last lock, held only for its COMMIT, so writers never
  deadlock on it, and SHARDS rows keep concurrent committers from queueing on one.

The watch polls every FAST seconds for WARM seconds after the last ring (a burst of work
keeps idle workers a few milliseconds away), then slows to SLOW seconds (what a long-idle
worker costs the server: 1 / SLOW queries per second). Polling by the worker loop
(``poll_interval``) stays the backstop for what rings nothing (a delay that expires).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any, cast

from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from .base import Listener, WakeCallback

#: bell rows per queue (``wake:0`` ...): concurrent committers spread over them
SHARDS = 8
#: seconds between looks while warm, ...
FAST = 0.01
#: ... for this many seconds after the bell last changed, ...
WARM = 1.0
#: ... then the interval grows (x GROW per look) up to this
SLOW = 0.05
GROW = 1.25
#: seconds a look may take before the watch reconnects (the worker's loop logs it)
LOOK_TIMEOUT = 10.0
#: ``Connection.info`` key: the meta tables whose bell this transaction rings at commit
_RING = "ajq_ring"


def bell_names() -> list[str]:
    """The ``meta`` row names of the bell's shards."""
    return [f"wake:{i}" for i in range(SHARDS)]


def ring(conn: AsyncConnection | Connection, meta: str) -> None:
    """Ring the bell of the queue whose ``meta`` table is named ``meta`` when ``conn``'s
    transaction commits (nothing if it rolls back)."""
    # (an AsyncConnection, or what stands for one, names its sync Connection)
    sync: Connection = getattr(conn, "sync_connection", None) or cast(Connection, conn)
    # The hooks go on this connection, not its engine: a ConnectionEvents listener on an
    # engine puts every statement of every connection on SQLAlchemy's event path (about
    # 10 more calls a job in a drain that rings nothing). A user's connection gets them
    # too, where a batch runs inside the user's transaction: it rings when the user commits.
    if not event.contains(sync, "commit", _commit):
        event.listen(sync, "commit", _commit)
        event.listen(sync, "rollback", _rollback)
    rings: set[str] = sync.info.setdefault(_RING, set())
    rings.add(meta)


def _commit(conn: Connection) -> None:
    """Just before COMMIT: add one to a random shard of each rung bell."""
    rings = conn.info.pop(_RING, None)
    if not rings:
        return
    shard = random.randrange(SHARDS)
    # the DBAPI cursor: one statement, no SQLAlchemy execution (and its events) inside the
    # commit; with an async driver its execute awaits in this greenlet
    cur = conn.connection.cursor()
    try:
        for meta in sorted(rings):  # one order: two queues' bells never deadlock
            cur.execute(f"UPDATE `{meta}` SET value = CAST(value AS UNSIGNED) + 1 "
                        f"WHERE name = 'wake:{shard}'")
    finally:
        cur.close()


def _rollback(conn: Connection) -> None:
    """A rolled-back transaction rings nothing."""
    if not conn.invalidated:  # (an invalidated connection's info went with it)
        conn.info.pop(_RING, None)


class BellWatch(Listener):
    """Polls the bell on a connection of its own (outside the pool, autocommit: each look
    sees the latest commits) and calls ``on_wake`` when it changed."""

    def __init__(self, engine: AsyncEngine, meta: str) -> None:
        self._url = engine.url
        self._meta = meta
        #: looks at the bell so far (bench/wake.py reports the rate an idle worker sends)
        self.looks = 0

    async def run(self, on_wake: WakeCallback) -> None:
        engine = create_async_engine(self._url, poolclass=NullPool,
                                     isolation_level="AUTOCOMMIT")
        names = ", ".join(f"'{n}'" for n in bell_names())
        look = (f"SELECT SUM(CAST(value AS UNSIGNED)) FROM `{self._meta}` "
                f"WHERE name IN ({names})")
        try:
            async with engine.connect() as conn:
                rows = ", ".join(f"('{n}', '0')" for n in bell_names())
                await conn.exec_driver_sql(
                    f"INSERT IGNORE INTO `{self._meta}` (name, value) VALUES {rows}")
                # (Re)connected: something may have rung while we were away. The first
                # look comes before that wake, so a ring the woken claim misses moves the
                # mark the next look compares with.
                last = await self._look(conn, look)
                on_wake("")
                await self._watch(conn, look, last, on_wake)
        finally:
            await engine.dispose()

    async def _look(self, conn: AsyncConnection, look: str) -> Any:
        try:  # a silently dead link would leave the look waiting for ever
            async with asyncio.timeout(LOOK_TIMEOUT):
                mark = (await conn.exec_driver_sql(look)).scalar()
        except TimeoutError:
            await conn.invalidate()  # (closing it would wait on the dead link too)
            raise ConnectionError(f"the bell watch got no answer in {LOOK_TIMEOUT}s") from None
        self.looks += 1
        return mark

    async def _watch(self, conn: AsyncConnection, look: str, last: Any,
                     on_wake: WakeCallback) -> None:
        loop = asyncio.get_running_loop()
        rang_at = loop.time()
        every = FAST
        while True:
            await asyncio.sleep(every)
            mark = await self._look(conn, look)
            now = loop.time()
            if mark != last:
                on_wake("")
                last, rang_at, every = mark, now, FAST
            elif now - rang_at > WARM:
                every = min(every * GROW, SLOW)

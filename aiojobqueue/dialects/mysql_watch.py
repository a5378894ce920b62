"""MySQL/MariaDB wake-up, the watching side: an interruptible sleep on the server that
ringers end with KILL QUERY (see mysql_bell.py), the bell counter read inside it.

Each look is one statement, tagged with the queue's name (``watch_tag``) so ringers find it
in the process list::

    SELECT /* ajq-bell:META */ b.m, IF(b.m <> <last>, 0, SLEEP(<wait>))
    FROM (SELECT SUM(...) AS m FROM META WHERE name IN ('wake:0', ...)) AS b

It reads the counter first and sleeps only if nothing rang since the last look. A ring that
commits before the statement starts is seen by its read (autocommit: a fresh read per
statement); one that commits later is followed by its KILL, which ends the statement
wherever it is (MariaDB answers 1317 "Query execution was interrupted", MySQL may return 1
from the SLEEP), never the connection. A KILL that reaches the connection between two
statements is dropped by the server, and the next statement's read sees that ring anyway.

The connection is the watch's own for its whole life: made by a private copy of the
queue's pool (``Pool.recreate``: the engine's URL, connect_args, creator and connect hooks,
never one of the worker's pooled connections) and never reconnected per wake. Only a real
loss closes it; then, and while connecting is refused (MAX_USER_CONNECTIONS' 1226, the
server away), the watch polls the bell every SLOW seconds on the queue's own pool and
connects again after a backoff (from RETRY seconds, doubling to RETRY_MAX: longer than a
sleep, so the lost connection's server thread is gone first), saying so once.

``wait`` is FAST while warm (WARM seconds after the bell last moved: a burst of work is a
poll a few milliseconds away, and ringers KILL each watch at most every THROTTLE seconds);
SLOW for the first GRACE seconds after connecting (until every ringer has looked at the
process list again) and while KILLs do not arrive (below); LONG otherwise: an idle worker
sends 1 / LONG statements per second, and a KILL ends the sleep within a millisecond of the
ringer's commit.

A sleep of LONG that runs out although the bell moved during it means the ring's KILL never
came (the ringer runs as another user without CONNECTION ADMIN, or kept its connection open
after the commit). After MISSES such looks in a row the watch says so once and polls every
SLOW seconds for REPROBE seconds, then tries again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from .base import Listener, WakeCallback
from .mysql_bell import bell_names, watch_tag

log = logging.getLogger("aiojobqueue.listener")

#: seconds a look sleeps while warm, ...
FAST = 0.01
#: ... for this many seconds after the bell last changed; ...
WARM = 1.0
#: ... while KILLs are not (yet) to be trusted, and between polls without the connection; ...
SLOW = 0.05
#: ... otherwise: a KILL ends it
LONG = 1.0
#: seconds after connecting before the watch trusts KILLs (ringers look at the process
#: list every mysql_bell.SEEN seconds)
GRACE = 1.5
#: sleeps that ran out in a row, the bell moved meanwhile, before the watch polls instead,
#: ... for this many seconds
MISSES = 3
REPROBE = 60.0
#: seconds past its sleep a look may take before the watch drops its connection
LOOK_TIMEOUT = 10.0
#: seconds before connecting again after a loss or a refusal, doubling up to RETRY_MAX
RETRY = 1.5
RETRY_MAX = 30.0
#: what the server answers a statement that KILL QUERY (or a statement time limit) ended:
#: MariaDB and MySQL 1317, MySQL's max_execution_time 3024, MariaDB's max_statement_time 1969
_INTERRUPTED = {1317, 3024, 1969}
#: what ends the watch's connection (or refuses it) rather than a bug: retried later
_LOST = (DBAPIError, PoolTimeout, ConnectionError, OSError, TimeoutError)


class BellWatch(Listener):
    """Sleeps on the server on a connection of its own and calls ``on_wake`` when the bell
    moved; polls the bell while that connection is lost or refused."""

    def __init__(self, engine: AsyncEngine, meta: str) -> None:
        self._engine = engine
        self._meta = meta
        names = ", ".join(f"'{n}'" for n in bell_names())
        self._sum = (f"SELECT COALESCE(SUM(CAST(value AS UNSIGNED)), 0) AS m "
                     f"FROM `{meta}` WHERE name IN ({names})")
        self._look = (f"SELECT {watch_tag(meta)} b.m, IF(b.m <> %s, 0, SLEEP(%s)) "
                      f"FROM ({self._sum}) AS b")
        #: statements sent so far (bench/wake.py reports the rate an idle worker sends) ...
        self.looks = 0
        #: ... of them ended by a KILL; sleeps of LONG that a ring did not end
        self.kills = 0
        self.misses = 0
        #: connections made, and the server's id of the current one (CONNECTION_ID())
        self.connects = 0
        self.thread: int | None = None
        #: whether the watch polls because KILLs did not arrive or it has no connection
        self.polling = False
        self._warned: set[str] = set()
        self._last = -1  # the bell's counter at the last look (-1: not read yet)
        rows = ", ".join(f"('{n}', '0')" for n in bell_names())
        #: the bell's rows, made by the first watch of the queue (a ring only updates)
        self._rows = f"INSERT IGNORE INTO `{meta}` (name, value) VALUES {rows}"
        self._made = False

    async def run(self, on_wake: WakeCallback) -> None:
        # a copy of the queue's pool: how it connects, none of its connections
        own = create_async_engine(self._engine.url,
                                  pool=self._engine.sync_engine.pool.recreate())
        retry = RETRY
        try:
            while True:
                try:
                    conn = await own.connect()
                except _LOST as exc:
                    self._say("connect", "the bell watch of %s cannot connect (%s): polling "
                              "every %.0f ms, connecting again with backoff",
                              self._meta, exc, SLOW * 1000)
                else:
                    watched = await self._serve(conn, on_wake)
                    if watched:
                        retry = RETRY
                await self._poll(retry, on_wake)
                retry = min(retry * 2, RETRY_MAX)
        finally:
            await asyncio.shield(own.dispose())

    async def _serve(self, conn: AsyncConnection, on_wake: WakeCallback) -> bool:
        """Watch on ``conn`` until it is lost (False if it never got as far as a look)."""
        self.connects += 1
        looked = self.looks
        try:
            await conn.run_sync(_execute, "SET autocommit = 1")
            await conn.run_sync(_execute, self._rows)
            self._made = True
            self.thread = await conn.run_sync(_execute, "SELECT CONNECTION_ID()")
            self.polling = False
            await self._watch(conn, on_wake)
        except _LOST as exc:
            self._say("lost", "the bell watch of %s lost its connection (%s): polling every "
                      "%.0f ms until it is back", self._meta, exc, SLOW * 1000)
        except BaseException:
            # cancelled (or failed) in the middle of a statement: the link is out of step,
            # so drop it rather than let closing it roll back on it
            await asyncio.shield(conn.invalidate())
            raise
        await asyncio.shield(conn.invalidate())
        self.thread = None
        return self.looks > looked

    async def _watch(self, conn: AsyncConnection, on_wake: WakeCallback) -> None:
        loop = asyncio.get_running_loop()
        # (re)connected: a ring may have come while it was away. The first look comes before
        # that wake, so a ring the woken claim misses moves the mark the next look compares.
        mark = await self._one(conn, -1, 0.0)
        self._last = mark if mark is not None else -1
        on_wake("")
        rang_at = float("-inf")
        trust_at = loop.time() + GRACE  # SLOW until then
        before = "short"  # how the previous look ended: "short", "killed" or "slept"
        misses = 0
        while True:
            now = loop.time()
            wait = FAST if now - rang_at < WARM else SLOW if now < trust_at else LONG
            mark = await self._one(conn, self._last, wait)
            if mark is None:  # ended by a KILL: look again at once
                self.kills += 1
                before = "killed"
                continue
            now = loop.time()
            if mark != self._last:
                on_wake("")
                if before == "killed":
                    misses = 0
                elif before == "slept":
                    self.misses += 1
                    misses += 1
                    log.debug("bell watch of %s: a ring came without a KILL", self._meta)
                    if misses >= MISSES:
                        misses = 0
                        trust_at = now + REPROBE
                        self._say("misses", "the bell watch of %s was not woken by KILL "
                                  "QUERY for %d rings in a row (a producer connects as another "
                                  "database user without CONNECTION ADMIN?): polling every "
                                  "%.0f ms, trying again every %.0f s",
                                  self._meta, MISSES, SLOW * 1000, REPROBE)
                self._last, rang_at = mark, now
                before = "short"
            else:
                before = "slept" if wait == LONG else "short"
            self.polling = now < trust_at

    async def _one(self, conn: AsyncConnection, last: int, wait: float) -> int | None:
        try:  # a silently dead link would leave the look waiting for ever
            async with asyncio.timeout(wait + LOOK_TIMEOUT):
                mark = await conn.run_sync(_sleep, self._look, last, wait)
        except TimeoutError:
            raise ConnectionError(
                f"the bell watch got no answer in {wait + LOOK_TIMEOUT}s") from None
        self.looks += 1
        return mark

    async def _poll(self, seconds: float, on_wake: WakeCallback) -> None:
        """Without a connection of its own: look at the bell every SLOW seconds for
        ``seconds`` on the queue's pool (a busy pool or an outage: the look waits or fails,
        the worker's poll_interval still holds)."""
        self.polling = True
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds
        while loop.time() < until:
            try:
                async with asyncio.timeout(LOOK_TIMEOUT):
                    if not self._made:
                        async with self._engine.begin() as conn:
                            await conn.exec_driver_sql(self._rows)
                        self._made = True
                    async with self._engine.connect() as conn:
                        mark = int((await conn.exec_driver_sql(self._sum)).scalar() or 0)
                self.looks += 1
                if mark != self._last:
                    if self._last != -1:
                        on_wake("")
                    self._last = mark
            except _LOST as exc:
                log.debug("bell watch of %s: a poll failed (%s)", self._meta, exc)
            await asyncio.sleep(SLOW)

    def _say(self, what: str, msg: str, *args: Any) -> None:
        """A warning the first time for ``what``, a debug line after."""
        level = logging.DEBUG if what in self._warned else logging.WARNING
        self._warned.add(what)
        log.log(level, msg, *args)


def _execute(conn: Connection, sql: str) -> Any:
    """One statement on the DBAPI cursor; its first value, if any."""
    cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        try:
            cur.execute(sql)
            row = cur.fetchone() if cur.description else None
        except conn.dialect.loaded_dbapi.Error as exc:
            raise _lost(exc) from exc
    finally:
        cur.close()
    return None if row is None else row[0]


def _lost(exc: BaseException) -> ConnectionError:
    """A driver error on the watch's own connection (the driver's own classes are no
    SQLAlchemy errors here): the connection is dropped and made again later."""
    return ConnectionError(f"the bell watch's connection failed: {exc}")


def _sleep(conn: Connection, sql: str, last: int, wait: float) -> int | None:
    """The bell's counter, after sleeping up to ``wait`` seconds if it was ``last``; None if
    the statement was interrupted. On the DBAPI cursor: no SQLAlchemy events (a user's
    echo or tracing) for a statement that runs every second."""
    cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        try:
            cur.execute(sql, (last, wait))
            row = cur.fetchone()
        except conn.dialect.loaded_dbapi.Error as exc:
            if (getattr(exc, "args", None) or (None,))[0] in _INTERRUPTED:
                return None
            raise _lost(exc) from exc
    finally:
        cur.close()
    if row is None:  # pragma: no cover - a SELECT of one row
        raise ConnectionError("the bell watch's look returned no row")
    if row[1] == 1:  # MySQL: a SLEEP() that KILL QUERY ended may return 1
        return None
    return int(row[0])

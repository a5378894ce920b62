"""MySQL/MariaDB wake-up, the watching side: an interruptible sleep on the server that
ringers end with KILL QUERY (see mysql_bell.py), the bell counter read inside it.

Each look is one statement, tagged with the queue's name (``watch_tag``) so ringers find it
in the process list::

    SELECT /* ajq-bell:META */ b.m, SLEEP(IF(b.m = <last>, <wait>, 0))
    FROM (SELECT SUM(...) AS m FROM META WHERE name IN ('wake:0', ...)) AS b

It reads the counter first and sleeps only if nothing rang since the last look, so a ring
that commits between two looks is seen by the next (a KILL that lands between statements
is dropped by the server). ``wait`` is

* FAST while warm (WARM seconds after the bell last moved: a burst of work is a poll of a
  few milliseconds away, and ringers KILL each watch at most every THROTTLE seconds);
* SLOW for the first GRACE seconds after connecting (until every ringer has looked at the
  process list again) and while KILLs do not arrive (below);
* LONG otherwise: an idle worker sends 1 / LONG statements per second, and a KILL ends the
  sleep within a millisecond of the ringer's commit.

A sleep of LONG that runs out although the bell moved during it means the ring's KILL
never came (the ringer runs as another user without CONNECTION ADMIN, cannot see this
thread in its process list, or is an older aiojobqueue). After MISSES such looks in a row
the watch logs it once and polls every SLOW seconds for REPROBE seconds, then tries again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .base import Listener, WakeCallback
from .mysql_bell import bell_names, watch_tag

log = logging.getLogger("aiojobqueue.listener")

#: seconds a look sleeps while warm, ...
FAST = 0.01
#: ... for this many seconds after the bell last changed; ...
WARM = 1.0
#: ... while KILLs are not (yet) to be trusted; ...
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
#: seconds past its sleep a look may take before the watch reconnects
LOOK_TIMEOUT = 10.0
#: what the server answers a statement that KILL QUERY (or a statement time limit) ended:
#: MariaDB and MySQL 1317, MySQL's max_execution_time 3024, MariaDB's max_statement_time 1969
_INTERRUPTED = {1317, 3024, 1969}


class BellWatch(Listener):
    """Sleeps on the server on a connection of its own, made by the queue's engine (its
    URL, connect_args and connect hooks) and taken out of its pool (autocommit: each look
    sees the latest commits), and calls ``on_wake`` when the bell moved."""

    def __init__(self, engine: AsyncEngine, meta: str) -> None:
        self._engine = engine
        self._meta = meta
        #: statements sent so far (bench/wake.py reports the rate an idle worker sends) ...
        self.looks = 0
        #: ... of them ended by a KILL; sleeps of LONG that a ring did not end
        self.kills = 0
        self.misses = 0
        #: whether the watch polls because KILLs did not arrive
        self.polling = False
        self._warned = False

    async def run(self, on_wake: WakeCallback) -> None:
        names = ", ".join(f"'{n}'" for n in bell_names())
        look = (f"SELECT {watch_tag(self._meta)} b.m, SLEEP(IF(b.m = %s, %s, 0)) FROM "
                f"(SELECT COALESCE(SUM(CAST(value AS UNSIGNED)), 0) AS m FROM `{self._meta}` "
                f"WHERE name IN ({names})) AS b")
        rows = ", ".join(f"('{n}', '0')" for n in bell_names())
        try:
            conn = await self._engine.connect()
        except PoolTimeout as exc:  # every pooled connection busy: the side loop retries
            raise ConnectionError(f"the bell watch found no free connection: {exc}") from exc
        try:
            # out of the pool: never counted against it, never handed to anyone else
            await conn.run_sync(lambda c: c.detach())
            # autocommit on the server (no SQLAlchemy isolation setting: it would be reset
            # on a pooled connection that is no longer this one)
            await conn.run_sync(_execute, "SET autocommit = 1", ())
            await conn.run_sync(_execute, f"INSERT IGNORE INTO `{self._meta}` (name, value) "
                                          f"VALUES {rows}", ())
            on_wake("")  # (re)connected: something may have rung while we were away
            try:
                await self._watch(conn, look, on_wake)
            except BaseException:
                # cancelled (or failed) in the middle of a statement: the link is out of
                # step, so drop it rather than let closing it roll back on it
                await asyncio.shield(conn.invalidate())
                raise
        finally:
            await conn.close()  # (after invalidate(): nothing left to close)

    async def _watch(self, conn: AsyncConnection, look: str, on_wake: WakeCallback) -> None:
        loop = asyncio.get_running_loop()
        last = -1
        rang_at = float("-inf")
        trust_at = loop.time() + GRACE  # SLOW until then
        before = "short"  # how the previous look ended: "short", "killed" or "slept"
        misses = 0
        while True:
            now = loop.time()
            wait = FAST if now - rang_at < WARM else SLOW if now < trust_at else LONG
            try:  # a silently dead link would leave the look waiting for ever
                async with asyncio.timeout(wait + LOOK_TIMEOUT):
                    mark = await conn.run_sync(_look, look, last, wait)
            except TimeoutError:  # (closing it would wait on the dead link: see run)
                raise ConnectionError(
                    f"the bell watch got no answer in {wait + LOOK_TIMEOUT}s") from None
            self.looks += 1
            if mark is None:  # ended by a KILL: look again at once
                self.kills += 1
                before = "killed"
                continue
            now = loop.time()
            if mark != last:
                if last != -1:
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
                            self._say_polling()
                last, rang_at = mark, now
                before = "short"
            else:
                before = "slept" if wait == LONG else "short"
            self.polling = now < trust_at

    def _say_polling(self) -> None:
        if not self._warned:
            self._warned = True
            log.warning(
                "the bell watch of %s was not woken by KILL QUERY for %d rings in a row "
                "(a producer connects as another database user without CONNECTION ADMIN, "
                "or runs an older aiojobqueue): polling every %.0f ms, trying again every "
                "%.0f s", self._meta, MISSES, SLOW * 1000, REPROBE)


def _execute(conn: Connection, sql: str, params: Any) -> None:
    cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cur.execute(sql, params)
    except conn.dialect.loaded_dbapi.Error as exc:
        raise _lost(exc) from exc
    finally:
        cur.close()


def _lost(exc: BaseException) -> ConnectionError:
    """A driver error on the watch's own connection: the worker's side loop reconnects on a
    ConnectionError (the driver's own classes are no SQLAlchemy errors here)."""
    return ConnectionError(f"the bell watch's connection failed: {exc}")


def _look(conn: Connection, sql: str, last: int, wait: float) -> int | None:
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
    if row[1] == 1:  # MySQL: a SLEEP() alone that KILL QUERY ended returns 1
        return None
    return int(row[0])

"""MySQL/MariaDB wake-up, the watching side: of a queue's idle watches one holds the baton
and looks at the bell (sleeping on the server while idle, ended by a ringer's KILL QUERY),
the others wait for the baton in ``GET_LOCK`` (ringing side: mysql_bell.py).

Each watch has a connection of its own for its whole life and loops::

    wait:   SELECT b.m, IF(b.m <> <last>, NULL, GET_LOCK(<baton>, W)) FROM (<sum>) b
            (W = FAST while warm, i.e. WARM seconds after the bell last moved, else WAIT)
    hold:   look (SELECT <sum>) at once; then take the cold lock (GET_LOCK(<cold>, 0)) and
            sleep:  SELECT b.m, IF(b.m <> <last>, 0, SLEEP(S)) FROM (<sum>) b
            (S = FAST while warm, else LONG) until the bell moved; then RELEASE_ALL_LOCKS()
            (killed: in the statement that reads the bell) and wait again.

The one killable sleeper is the holder, warm or cold, so a ringer's KILL ends its sleep
within a round trip of the commit (completion -> next start across processes comes while
every watch is warm). A waiter whose read shows a new mark wakes its worker; while warm it
waits at most FAST for the baton, so it reads the bell every FAST seconds whatever the
hand-overs do (a burst of work is a few milliseconds away from every idle worker, never a
line of hand-overs), and a holder that lets go after a ring hands the baton to one of them
at once: that one looks first, sees the ring, wakes its worker and lets go, and so the
baton passes down the waiters until one with nothing new keeps it. If the holder's
connection dies the server frees its locks and a waiter takes over.

No ring is lost. A ring commits at tC, then its ringer reads the cold lock's holder (tI >
tC) and KILLs it. If some watch is cold at tI, its sleep statement either started before
tC (the KILL ends it; its next read is after tC) or not (its read is after tC; a KILL
between two statements is dropped by the server, and one that ends a later statement just
makes it look again). If nobody is cold at tI, every watch either reads the bell after tI
in its next statement (a holder that is warm, about to take the cold lock, or the next one
to take the baton: each looks before it sleeps), or waits for the baton behind one that
does (a warm watch reads it every FAST seconds). A KILL the ringer's THROTTLE skips finds
a holder that saw a ring less than THROTTLE ago: warm, it looks again within FAST. The
counter is the truth; KILL only shortens a sleep.

While KILLs do not arrive (a ringer of another database user without CONNECTION ADMIN, a
connection kept open after its commit: a LONG sleep runs out although the bell moved,
MISSES times in a row) the holder says so once and polls every SLOW seconds without the
cold lock for REPROBE seconds. While the watch has no connection (lost, or refused:
MAX_USER_CONNECTIONS' 1226, the server away, GET_LOCK refused) it polls the bell every SLOW
seconds on the queue's pool and connects again after a backoff (from RETRY seconds,
doubling to RETRY_MAX: longer than a sleep, so a lost connection's thread is gone first).

What an idle fleet sends: the holder 1 / LONG statements a second, each waiter 1 / WAIT;
warm, each watch about 1 / FAST, as when it polled. A waiter whose worker is busy (its
claims come back full: ``Listener.busy``) waits as when cold, warm or not: in a drain over
8 processes the warm waiters' FAST looks were a sixth of all the statements the fleet sent.
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
from .mysql_bell import bell_names, lock_name

log = logging.getLogger("aiojobqueue.listener")

#: seconds a warm holder sleeps (a KILL ends it) and a warm waiter waits for the baton, ...
FAST = 0.01
#: ... for this many seconds after the bell last changed (above mysql_bell.THROTTLE); ...
WARM = 1.0
#: ... after a KILL woke the holder, before it takes the baton again (below FAST); ...
REST = 0.005
#: ... between polls while KILLs do not arrive or the watch has no connection; ...
SLOW = 0.05
#: ... a cold holder's sleep (a KILL ends it), and a waiter's wait for the baton
LONG = 1.0
WAIT = 2.0
#: LONG sleeps that ran out in a row, the bell moved meanwhile, before the holder polls
#: instead, ... for this many seconds
MISSES = 3
REPROBE = 60.0
#: seconds past its sleep a statement may take before the watch drops its connection
LOOK_TIMEOUT = 10.0
#: seconds before connecting again after a loss or a refusal, doubling up to RETRY_MAX
RETRY = 1.5
RETRY_MAX = 30.0
#: what the server answers a statement that KILL QUERY (or a statement time limit) ended:
#: MariaDB and MySQL 1317, MySQL's max_execution_time 3024, MariaDB's max_statement_time 1969
_INTERRUPTED = {1317, 3024, 1969}
#: what ends the watch's connection (or refuses it) rather than a bug: retried later
_LOST = (DBAPIError, PoolTimeout, ConnectionError, OSError, TimeoutError)
#: a statement that KILL QUERY ended
KILLED = object()


class BellWatch(Listener):
    """Waits for the queue's baton or, holding it, watches the bell on a connection of its
    own, calling ``on_wake`` when the bell moved; polls it while that connection is lost."""

    def __init__(self, engine: AsyncEngine, meta: str) -> None:
        self._engine = engine
        self._meta = meta
        names = ", ".join(f"'{n}'" for n in bell_names())
        self._sum = (f"SELECT COALESCE(SUM(CAST(value AS UNSIGNED)), 0) AS m "
                     f"FROM `{meta}` WHERE name IN ({names})")
        self._wait = (f"SELECT b.m, IF(b.m <> %s, NULL, GET_LOCK({lock_name(meta, 'baton')}, "
                      f"%s)) FROM ({self._sum}) AS b")
        self._cold = f"SELECT GET_LOCK({lock_name(meta, 'cold')}, 0)"
        self._sleep = f"SELECT b.m, IF(b.m <> %s, 0, SLEEP(%s)) FROM ({self._sum}) AS b"
        self._release = f"SELECT b.m, RELEASE_ALL_LOCKS() FROM ({self._sum}) AS b"
        rows = ", ".join(f"('{n}', '0')" for n in bell_names())
        #: the bell's rows, made by the first watch of the queue (a ring only updates)
        self._rows = f"INSERT IGNORE INTO `{meta}` (name, value) VALUES {rows}"
        self._made = False
        #: statements sent so far (bench/wake.py reports the rate an idle worker sends) ...
        self.looks = 0
        #: ... of them ended by a KILL; LONG sleeps that a ring did not end; baton takes
        self.kills = 0
        self.misses = 0
        self.takes = 0
        #: connections made, and the server's id of the current one (CONNECTION_ID())
        self.connects = 0
        self.thread: int | None = None
        #: whether it holds the baton; sleeps cold; polls (KILLs missing or no connection)
        self.holding = False
        self.cold = False
        self.polling = False
        self._warned: set[str] = set()
        self._last = -1  # the bell's counter at the last look (-1: not read yet)
        self._rang_at = float("-inf")
        self._trust_at = float("-inf")  # polls instead of sleeping until then
        self._misses = 0

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
                    if await self._serve(conn, on_wake):
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
            await self._run(conn, "SET autocommit = 1")
            await self._run(conn, self._rows)
            self._made = True
            self.thread = await self._run(conn, "SELECT CONNECTION_ID()")
            # (re)connected: a ring may have come while it was away. The first look comes
            # before that wake, so a ring the woken claim misses moves the mark it compares.
            mark: Any = KILLED
            while mark is KILLED:
                mark = await self._run(conn, self._sum)
            self._last = int(mark)
            self.polling = False
            on_wake("")
            while True:
                await self._wait_turn(conn, on_wake)
                await self._hold(conn, on_wake)
        except _LOST as exc:
            self._say("lost", "the bell watch of %s lost its connection (%s): polling every "
                      "%.0f ms until it is back", self._meta, exc, SLOW * 1000)
        except BaseException:
            # cancelled (or failed) in the middle of a statement: the link is out of step,
            # so drop it rather than let closing it roll back on it
            await asyncio.shield(conn.invalidate())
            raise
        finally:
            self.holding = self.cold = False
        await asyncio.shield(conn.invalidate())  # (its locks go with it: a waiter takes over)
        self.thread = None
        return self.looks > looked

    def _moved(self, mark: int, on_wake: WakeCallback) -> None:
        self._last = mark
        self._rang_at = asyncio.get_running_loop().time()
        on_wake("")

    async def _wait_turn(self, conn: AsyncConnection, on_wake: WakeCallback) -> None:
        """Return holding the baton, waking the worker for each new mark seen meanwhile."""
        loop = asyncio.get_running_loop()
        while True:
            # warm (a burst): wait at most FAST for the baton, so this watch reads the bell
            # every FAST seconds whatever the hand-overs do; a holder that lets go after a
            # ring hands the baton to one of them at once (it looks first: a wake within
            # a few round trips of the ringer's KILL, not at the next poll). Not while its
            # worker is busy (claiming again at once: a wake changes nothing): it waits for
            # the baton as when cold, and learns of a ring when the baton comes to it
            warm = loop.time() - self._rang_at < WARM and not self.busy()
            wait = FAST if warm else WAIT
            began = loop.time()
            row = await self._run(conn, self._wait, (self._last, wait), wait, whole=True)
            if row is KILLED:  # (a KILL meant for the holder this watch was)
                continue
            mark, got = int(row[0]), row[1]
            if mark != self._last:
                self._moved(mark, on_wake)
            elif got == 1:
                self.takes += 1
                self.holding = True
                return
            elif warm and loop.time() - began < FAST / 2:
                # (a server that rounds a fractional timeout down to 0 answered at once)
                await asyncio.sleep(FAST)

    async def _hold(self, conn: AsyncConnection, on_wake: WakeCallback) -> None:
        """Holding the baton: look, then sleep on the server under the cold lock (FAST
        seconds while warm, LONG after) or poll, until the bell moves; let go."""
        loop = asyncio.get_running_loop()
        first = True
        ran_out = False  # the last statement was a LONG sleep that nothing ended
        while True:
            now = loop.time()
            warm = now - self._rang_at < WARM
            slept = False
            if first or now < self._trust_at:  # (the first look; polling: KILLs missing)
                if self.cold:
                    await self._run(conn, f"DO RELEASE_LOCK({lock_name(self._meta, 'cold')})")
                    self.cold = False
                if not first:
                    await asyncio.sleep(FAST if warm else SLOW)
                mark: Any = await self._run(conn, self._sum)
            else:
                if not self.cold:
                    got = await self._run(conn, self._cold)
                    self.cold = got == 1
                    if got is KILLED:  # (a KILL meant for this watch's last sleep)
                        continue
                    if not self.cold:  # (held elsewhere: a namesake queue on this server)
                        self._say("cold", "the bell watch of %s cannot take its cold lock: "
                                  "polling every %.0f ms", self._meta, SLOW * 1000)
                        self._trust_at = now + REPROBE
                        continue
                # Warm, too, it sleeps where a ringer's KILL ends it (a FAST sleep: a KILL
                # the ringer's THROTTLE skipped costs no more than the poll it replaces)
                mark = await self._run(conn, self._sleep, (self._last, FAST if warm else LONG),
                                       FAST if warm else LONG)
                slept = not warm
            first = False
            self.polling = loop.time() < self._trust_at
            if mark is KILLED:  # a ringer's, after its commit: wake the worker now, let go
                await self._let_go_killed(conn, on_wake)
                return  # (a KILL that announced nothing: the baton is taken again)
            if int(mark) == self._last:
                ran_out = slept
                continue
            if ran_out:  # a LONG sleep ran out although the bell moved meanwhile: no KILL
                self._missed()
            self._moved(int(mark), on_wake)
            while await self._run(conn, "SELECT RELEASE_ALL_LOCKS()") is KILLED:
                pass
            self.holding = self.cold = False
            return

    async def _let_go_killed(self, conn: AsyncConnection, on_wake: WakeCallback) -> None:
        """A ringer's KILL ended the holder's statement, after its commit: wake the worker,
        let go of the baton (noting a new mark) and rest while the worker claims."""
        self.kills += 1
        self._misses = 0
        on_wake("")
        # Let go of the baton in the statement that reads the bell, so that the next
        # waiter takes it (and looks) one round trip sooner
        row: Any = KILLED
        while row is KILLED:
            row = await self._run(conn, self._release, whole=True)
        self.holding = self.cold = False
        if int(row[0]) != self._last:
            self._last = int(row[0])
            self._rang_at = asyncio.get_running_loop().time()
        # the woken worker claims now: its statements go first, this watch's
        # (taking the baton again, looking, sleeping) REST seconds after (a waiter
        # has the baton already)
        await asyncio.sleep(REST)

    def _missed(self) -> None:
        self.misses += 1
        self._misses += 1
        log.debug("bell watch of %s: a ring came without a KILL", self._meta)
        if self._misses >= MISSES:
            self._misses = 0
            self._trust_at = asyncio.get_running_loop().time() + REPROBE
            self._say("misses", "the bell watch of %s was not woken by KILL QUERY for %d "
                      "rings in a row (a producer connects as another database user without "
                      "CONNECTION ADMIN?): polling every %.0f ms, trying again every %.0f s",
                      self._meta, MISSES, SLOW * 1000, REPROBE)

    async def _run(self, conn: AsyncConnection, sql: str, args: tuple[Any, ...] | None = None,
                   wait: float = 0.0, whole: bool = False) -> Any:
        """One statement; its first value (its row if ``whole``), KILLED if a KILL ended it."""
        try:  # a silently dead link would leave the statement waiting for ever
            async with asyncio.timeout(wait + LOOK_TIMEOUT):
                out = await conn.run_sync(_execute, sql, args, whole)
        except TimeoutError:
            raise ConnectionError(
                f"the bell watch got no answer in {wait + LOOK_TIMEOUT}s") from None
        self.looks += 1
        return out

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


def _execute(conn: Connection, sql: str, args: tuple[Any, ...] | None, whole: bool) -> Any:
    """One statement on the DBAPI cursor (no SQLAlchemy events, a user's echo or tracing, for
    a statement that runs every second): its first value or row; KILLED if interrupted."""
    cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        try:
            cur.execute(sql, args)
            row = cur.fetchone() if cur.description else None
        except conn.dialect.loaded_dbapi.Error as exc:
            if (getattr(exc, "args", None) or (None,))[0] in _INTERRUPTED:
                return KILLED
            raise ConnectionError(f"the bell watch's connection failed: {exc}") from exc
    finally:
        cur.close()
    if row is None:
        return None
    if len(row) == 2 and not whole and row[1] == 1:  # MySQL: a SLEEP() a KILL ended gives 1
        return KILLED
    if whole:
        return row
    return row[0]

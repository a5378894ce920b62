"""MySQL/MariaDB wake-up, the ringing side: a doorbell counter in ``meta``, and at most one
KILL QUERY after the commit, to the one watch of the queue that sleeps on the server (the
watches: mysql_watch.py).

The servers have no LISTEN/NOTIFY, but a session may end another session's running
statement (``KILL QUERY id``: always its own user's, another user's with CONNECTION ADMIN
or SUPER) without closing its connection, and ``IS_USED_LOCK(name)`` names the connection
holding a user lock. Of a queue's idle watches only one, the holder of the queue's *baton*
lock, looks at the bell; while it sleeps on the server it also holds the *cold* lock. So:

* Every transaction that makes a job runnable (an enqueue of a ready job, a release of
  dependents, a job handed back) calls ``DialectOps.notify``; that only marks the
  connection. Its ``commit`` hook adds one to a random row of the SHARDS ``wake:N`` rows of
  the queue's ``meta`` table just before COMMIT (they commit together: a rolled-back
  transaction rings nothing, a watch never sees the bell before the rows it announces; the
  bell row is the transaction's last lock, held only for its COMMIT, and SHARDS rows keep
  concurrent committers from queueing on one).
* When the connection goes back to its pool, i.e. after the COMMIT, the pool's ``checkin``
  hook sends ``KILL QUERY IS_USED_LOCK(<cold lock>)``: one statement that ends the sleep of
  whoever holds the queue's cold lock (nobody: the server answers "unknown thread id 0";
  a server that wants a number gets ``SELECT IS_USED_LOCK`` and the KILL). At most one
  KILL that found a sleeper per THROTTLE seconds per pool and queue. No process list is
  read and no table row names a thread: the lock is the server's live truth (a dead
  connection's locks go with it, and ids are never stale after a restart).
* The counter stays the truth: the sleeper reads it inside its sleep statement, so a KILL
  that comes early, late, twice or never loses nothing (mysql_watch.py has the argument).

Why one sleeper: KILL QUERY of a thread in ``SLEEP()`` must take the server-wide mutex all
sleepers enter and leave by (MariaDB's ``LOCK_item_func_sleep``; it tries for up to a second
in 50 ms steps while holding the victim's thread lock, which the process list and other
KILLs wait for). With every idle watch asleep and every ringer killing each of them, a
16-process fleet stalled for seconds; with one sleeper per queue and one KILL per ring
there is nobody to contend with. The other watches wait in ``GET_LOCK`` (a metadata lock
wait on a mutex of their own) and are never killed by design.
"""

from __future__ import annotations

import logging
import random
import time
import weakref
from typing import Any, cast

from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.pool import Pool

log = logging.getLogger("aiojobqueue.listener")

#: bell rows per queue (``wake:0`` ...): concurrent committers spread over them
SHARDS = 8
#: seconds between two KILLs of a queue's sleeper by one pool; well below mysql_watch.WARM:
#: a watch that saw a ring sleeps only FAST seconds at a time for WARM seconds after, so the
#: sleeper a skipped KILL would have found is one that looks again within FAST anyway (a
#: busy pool ends the warm holder's sleep at most 20 times a second)
THROTTLE = 0.05
#: seconds a ringer's look-up and KILL may take before it says so in the log
SLOW_WAKE = 0.2
#: ``Connection.info`` keys (the pool record's: they outlive the checkout): the meta tables
#: whose bell this transaction rings at commit; those it rang, whose holder to wake
_RING = "ajq_ring"
_KILL = "ajq_kill"
#: the server's "unknown thread id" and "you are not owner of thread"
_UNKNOWN, _REFUSED = 1094, 1095


def bell_names() -> list[str]:
    """The ``meta`` row names of the bell's shards."""
    return [f"wake:{i}" for i in range(SHARDS)]


def lock_name(meta: str, kind: str) -> str:
    """The SQL expression naming the queue's ``kind`` lock ("baton" or "cold"): user locks
    are server-wide, so the name carries the database too, hashed to fit the 64 characters
    MySQL allows (``meta`` is an identifier of the queue's own: no quoting needed)."""
    return f"CONCAT('ajq{kind[0]}', SHA1(CONCAT(DATABASE(), '.', '{meta}')))"


def ring(conn: AsyncConnection | Connection, meta: str) -> None:
    """Ring the bell of the queue whose ``meta`` table is named ``meta`` when ``conn``'s
    transaction commits (nothing if it rolls back), and wake its sleeper after that."""
    # (an AsyncConnection, or what stands for one, names its sync Connection)
    sync: Connection = getattr(conn, "sync_connection", None) or cast(Connection, conn)
    # The hooks go on this connection, not its engine: a ConnectionEvents listener on an
    # engine puts every statement of every connection on SQLAlchemy's event path (about
    # 10 more calls a job in a drain that rings nothing). A user's connection gets them
    # too, where a batch runs inside the user's transaction: it rings when the user commits.
    if not event.contains(sync, "commit", _commit):
        event.listen(sync, "commit", _commit)
        event.listen(sync, "rollback", _rollback)
    _bell_of(sync.engine.pool)
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
    conn.info.setdefault(_KILL, set()).update(rings)  # woken at checkin, after the COMMIT


def _rollback(conn: Connection) -> None:
    """A rolled-back transaction rings nothing."""
    if not conn.invalidated:  # (an invalidated connection's info went with it)
        conn.info.pop(_RING, None)
        conn.info.pop(_KILL, None)


class Bell:
    """One pool's ringer state."""

    def __init__(self) -> None:
        #: meta -> time.monotonic() of this pool's last KILL of its sleeper
        self.killed: dict[str, float] = {}
        #: whether the server takes ``KILL QUERY IS_USED_LOCK(...)``
        self.combined = True
        self.warned = False
        #: KILL QUERY statements that found a sleeper, and the slowest wake's seconds
        self.kills = 0
        self.slowest = 0.0

    def checkin(self, dbapi_conn: Any, record: Any) -> None:
        """A connection is back in the pool, its transaction over: if it committed a ring,
        end the sleep of each rung queue's sleeper."""
        metas = record.info.pop(_KILL, None) if record is not None else None
        if not metas or dbapi_conn is None:
            return
        began = time.monotonic()
        try:
            cur = dbapi_conn.cursor()
            try:
                for meta in sorted(metas):
                    self._wake(cur, meta)
            finally:
                cur.close()
        except Exception as exc:  # never fail a release: the sleep runs out instead
            log.debug("bell: waking the sleeper failed (%s)", exc)
        took = time.monotonic() - began
        self.slowest = max(self.slowest, took)
        if took > SLOW_WAKE:  # (the connection was the pool's meanwhile: say so)
            log.warning("bell: waking the sleeper of %s took %.3f s", ", ".join(metas), took)

    def _wake(self, cur: Any, meta: str) -> None:
        """KILL QUERY the holder of ``meta``'s cold lock, if any: one statement where the
        server takes an expression for the thread id (MariaDB, MySQL 8), else a look-up and
        the KILL."""
        now = time.monotonic()
        if now - self.killed.get(meta, -1e9) < THROTTLE:
            return
        try:
            if self.combined:
                try:
                    cur.execute(f"KILL QUERY IS_USED_LOCK({lock_name(meta, 'cold')})")
                except Exception as exc:
                    if _code(exc) in (_UNKNOWN, _REFUSED):
                        raise
                    self.combined = False  # (this server wants a number: ask, then KILL)
                    log.debug("bell: KILL QUERY IS_USED_LOCK() refused (%s)", exc)
            if not self.combined:
                cur.execute(f"SELECT IS_USED_LOCK({lock_name(meta, 'cold')})")
                row = cur.fetchone()
                if not row or row[0] is None:
                    return
                cur.execute(f"KILL QUERY {int(row[0])}")
        except Exception as exc:
            code = _code(exc)
            if code == _UNKNOWN:  # nobody cold (IS_USED_LOCK gave NULL: "thread id 0")
                return
            if code != _REFUSED:
                raise
            if not self.warned:
                self.warned = True
                log.warning(
                    "KILL QUERY of the bell watch of %s refused (it runs as another database "
                    "user; waking it needs CONNECTION ADMIN or SUPER): that worker notices "
                    "this process's jobs when its sleep runs out, then by polling", meta)
            return
        self.killed[meta] = now  # (a sleeper was there: it looks again now)
        self.kills += 1


def _code(exc: BaseException) -> Any:
    """The server's error number of a driver error."""
    return (getattr(exc, "args", None) or (None,))[0]


#: one Bell per pool (an engine's dispose() makes a new pool: a new Bell with it)
_BELLS: weakref.WeakKeyDictionary[Pool, Bell] = weakref.WeakKeyDictionary()


def _bell_of(pool: Pool) -> Bell:
    """The pool's Bell, its ``checkin`` hook installed the first time (a pool event, once
    per returned connection: no statement passes through it)."""
    bell = _BELLS.get(pool)
    if bell is None:
        bell = _BELLS[pool] = Bell()
        event.listen(pool, "checkin", bell.checkin)
    return bell

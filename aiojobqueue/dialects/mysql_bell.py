"""MySQL/MariaDB wake-up, the ringing side: a doorbell counter in ``meta``, and a KILL QUERY
after the commit that ends the watches' sleep on the server (the watch: mysql_watch.py).

The servers have no LISTEN/NOTIFY, but a session may end another session's running
statement (``KILL QUERY id``: always its own user's, another user's with CONNECTION ADMIN
or SUPER) without closing its connection. So an idle worker's watch sits in a
``SELECT ... SLEEP(s)`` tagged with its queue's name, and whoever makes a job runnable ends
that sleep:

* Every transaction that makes a job runnable (an enqueue of a ready job, a release of
  dependents, a job handed back) calls ``DialectOps.notify``; that only marks the
  connection. Its ``commit`` hook adds one to a random row of the SHARDS ``wake:N`` rows of
  the queue's ``meta`` table just before COMMIT (they commit together: a rolled-back
  transaction rings nothing, a watch never sees the bell before the rows it announces; the
  bell row is the transaction's last lock, held only for its COMMIT, and SHARDS rows keep
  concurrent committers from queueing on one).
* When the connection goes back to its pool, i.e. after the COMMIT, the pool's ``checkin``
  hook sends ``KILL QUERY`` to the queue's watches: the threads its last look at the
  process list showed running the tagged watch statement (a look at most every SEEN
  seconds per pool, also after the COMMIT), each at most once per THROTTLE seconds per pool
  (a watch just woken polls for a second anyway). Nobody sleeping: no KILL at all. Both
  hooks talk to the DBAPI connection directly: no SQLAlchemy statement events.
* The counter stays the truth: a watch reads it inside its sleep statement, so a KILL that
  comes early, late, twice or never loses nothing; without one (a refused KILL, a
  connection kept open after its commit) the watch's sleep runs out and it sees the counter
  moved (mysql_watch.py: after a few such misses it polls).

A watch's connection runs nothing but the watch statement for its whole life, so a thread
id seen running it names a watch until that connection ends (and a thread id is never
reused while the server runs). After a server restart ids start again: a pooled connection
made after the last look at the process list throws the looked-up ids away first.
"""

from __future__ import annotations

import logging
import random
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, cast

from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.pool import Pool

log = logging.getLogger("aiojobqueue.listener")

#: bell rows per queue (``wake:0`` ...): concurrent committers spread over them
SHARDS = 8
#: seconds a ringer trusts its look at the process list (a new watch polls this long first)
SEEN = 1.0
#: seconds between two KILLs of one watch by one pool (a woken watch polls for a second)
THROTTLE = 0.5
#: ``Connection.info`` keys (the pool record's: they outlive the checkout): the meta tables
#: whose bell this transaction rings at commit; those it rang, whose watches to wake
_RING = "ajq_ring"
_KILL = "ajq_kill"
#: the server's "unknown thread id" and "you are not owner of thread"
_UNKNOWN, _REFUSED = 1094, 1095


def bell_names() -> list[str]:
    """The ``meta`` row names of the bell's shards."""
    return [f"wake:{i}" for i in range(SHARDS)]


def watch_tag(meta: str) -> str:
    """The comment that starts a watch's sleep statement: how ringers find it in the
    process list."""
    return f"/* ajq-bell:{meta} */"


def ring(conn: AsyncConnection | Connection, meta: str) -> None:
    """Ring the bell of the queue whose ``meta`` table is named ``meta`` when ``conn``'s
    transaction commits (nothing if it rolls back), and wake its watches after that."""
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


@dataclass
class Sleepers:
    """What one pool knows of one queue's watches."""

    #: thread ids seen running the watch statement (kept until a KILL says they are gone)
    ids: set[int] = field(default_factory=set)
    #: ids whose KILL was refused (another user): never tried again
    refused: set[int] = field(default_factory=set)
    #: time.time() of the last look at the process list
    seen_at: float = float("-inf")
    #: id -> time.time() of its last KILL from this pool
    killed: dict[int, float] = field(default_factory=dict)

    def due(self, cur: Any, meta: str, born: float) -> list[int]:
        """The watches to KILL for a ring now, looking at the process list (on ``cur``)
        when the last look is old or older than the connection (``born``)."""
        now = time.time()
        if born > self.seen_at:  # maybe another server instance: its ids mean nothing here
            self.ids.clear()
            self.killed.clear()
        if now - self.seen_at > SEEN or born > self.seen_at:
            self.seen_at = now
            # (a LIKE prefix: "_" in the name matches any character, at worst a spurious wake)
            try:
                cur.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE INFO LIKE %s",
                            (f"SELECT {watch_tag(meta)}%",))
                self.ids |= {int(r[0]) for r in cur.fetchall()} - self.refused
            except Exception as exc:  # (unreadable: the watches' sleep runs out instead)
                log.debug("bell: the process list is unreadable (%s)", exc)
        out = [i for i in self.ids if now - self.killed.get(i, float("-inf")) >= THROTTLE]
        for i in out:
            self.killed[i] = now
        return out

    def gone(self, thread: int, refused: bool) -> None:
        """``thread`` is no watch of ours to KILL (ended, or another user's)."""
        self.ids.discard(thread)
        self.killed.pop(thread, None)
        if refused:
            self.refused.add(thread)


class Bell:
    """One pool's ringer state: per queue ``meta`` table, its watches."""

    def __init__(self) -> None:
        self.queues: dict[str, Sleepers] = {}
        self.warned = False
        #: KILL QUERY statements sent (tests and bench/wake.py read it)
        self.kills = 0

    def sleepers(self, meta: str) -> Sleepers:
        """The watches of the queue whose bell is in ``meta``."""
        s = self.queues.get(meta)
        if s is None:
            s = self.queues[meta] = Sleepers()
        return s

    def checkin(self, dbapi_conn: Any, record: Any) -> None:
        """A connection is back in the pool, its transaction over: if it committed a ring,
        end the sleep of the watches of each queue it rang."""
        metas = record.info.pop(_KILL, None) if record is not None else None
        if not metas or dbapi_conn is None:
            return
        try:
            cur = dbapi_conn.cursor()
            try:
                for meta in sorted(metas):
                    s = self.sleepers(meta)
                    for thread in s.due(cur, meta, getattr(record, "starttime", 0.0)):
                        self._kill(cur, s, meta, thread)
            finally:
                cur.close()
        except Exception as exc:  # never fail a release: the watches' sleep runs out instead
            log.debug("bell: KILL QUERY failed (%s)", exc)

    def _kill(self, cur: Any, s: Sleepers, meta: str, thread: int) -> None:
        try:
            self.kills += 1
            cur.execute(f"KILL QUERY {int(thread)}")
        except Exception as exc:
            code = (getattr(exc, "args", None) or (None,))[0]
            if code not in (_UNKNOWN, _REFUSED):
                raise
            s.gone(thread, refused=code == _REFUSED)
            if code == _REFUSED and not self.warned:
                self.warned = True
                log.warning(
                    "KILL QUERY of a bell watch of %s refused (it runs as another database "
                    "user; waking it needs CONNECTION ADMIN or SUPER): that worker notices "
                    "this process's jobs when its sleep runs out, then by polling", meta)


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

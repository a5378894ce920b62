"""MySQL/MariaDB wake-up, the ringing side: a doorbell counter in ``meta``, and a KILL QUERY
that ends the watches' interruptible sleep once the rows are committed.

The servers have no LISTEN/NOTIFY, but a session may end another session's running
statement (``KILL QUERY id``: always its own user's, another user's with CONNECTION ADMIN
or SUPER). So an idle worker's watch (mysql_watch.py) sits in a ``SELECT ... SLEEP(s)``
tagged with its queue's name, and whoever makes a job runnable ends that sleep:

* Every transaction that makes a job runnable (an enqueue of a ready job, a release of
  dependents, a job handed back) calls ``DialectOps.notify``; that only marks the
  connection. Its ``commit`` hook adds one to a random row of the SHARDS ``wake:N`` rows of
  the queue's ``meta`` table just before COMMIT (the rows commit together: a rolled-back
  transaction rings nothing, a watch never sees the bell before the rows it announces; the
  bell row is the transaction's last lock, held only for its COMMIT).
* The same hook picks the watches to wake: the threads the process list shows running the
  queue's tagged watch statement (looked up at most every SEEN seconds per engine, inside
  the transaction), each at most once per THROTTLE seconds (a watch just woken polls for a
  second anyway). Their ids wait in the connection's ``info`` until the connection goes
  back to the pool, i.e. after the COMMIT (SQLAlchemy's ``commit`` event fires before it),
  and are sent there as ``KILL QUERY`` (one round trip each).
* The counter stays the truth: a watch re-reads it inside its sleep statement, so a KILL
  that comes early, late, twice or never loses nothing; without one (a refused KILL, an
  older producer, a connection kept open after its commit) the watch's sleep runs out and
  it notices the counter moved (see mysql_watch.py: it then polls).

A thread id is never reused while the server runs; after a restart ids start again, so a
connection made after the last look at the process list throws the looked-up ids away
and looks again before it KILLs anything.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection

log = logging.getLogger("aiojobqueue.listener")

#: bell rows per queue (``wake:0`` ...): concurrent committers spread over them
SHARDS = 8
#: seconds a ringer trusts its look at the process list (a new watch polls this long first)
SEEN = 1.0
#: seconds between two KILLs of one watch by one process (a woken watch polls for WARM)
THROTTLE = 0.5
#: ``Connection.info`` keys: the meta tables whose bell this transaction rings at commit; the
#: watch threads to KILL once the connection is back in the pool; when it was connected
_RING = "ajq_ring"
_KILL = "ajq_kill"
_BORN = "ajq_born"
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
    transaction commits (nothing if it rolls back)."""
    _hook(conn.sync_engine if isinstance(conn, AsyncConnection) else conn.engine)
    rings: set[str] = conn.info.setdefault(_RING, set())
    rings.add(meta)


@dataclass
class Sleepers:
    """What one engine knows of one queue's watches."""

    #: thread ids seen running the watch statement (kept until a KILL says they are gone)
    ids: set[int] = field(default_factory=set)
    #: ids whose KILL was refused (another user): never tried again
    refused: set[int] = field(default_factory=set)
    #: time.monotonic() of the last look at the process list
    seen_at: float = float("-inf")
    #: id -> time.monotonic() of its last KILL from here
    killed: dict[int, float] = field(default_factory=dict)

    def due(self, cur: Any, meta: str, born: float) -> list[int]:
        """The watches to KILL for a ring now, looking at the process list (on ``cur``)
        when the last look is old or older than the connection."""
        now = time.monotonic()
        if born > self.seen_at:  # maybe another server instance: its ids mean nothing here
            self.ids.clear()
        if now - self.seen_at > SEEN or born > self.seen_at:
            self.seen_at = now
            # (a LIKE prefix: "_" in the name matches any character, at worst a spurious wake)
            try:
                cur.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE INFO LIKE %s",
                            (f"SELECT {watch_tag(meta)}%",))
                self.ids |= {int(r[0]) for r in cur.fetchall()} - self.refused
            except Exception as exc:  # (MySQL deprecates the table): the watches poll
                log.debug("bell: the process list is unreadable (%s)", exc)
        out = [i for i in self.ids if now - self.killed.get(i, float("-inf")) >= THROTTLE]
        for i in out:
            self.killed[i] = now
        return out

    def gone(self, thread: int, refused: bool) -> None:
        self.ids.discard(thread)
        self.killed.pop(thread, None)
        if refused:
            self.refused.add(thread)


class Bell:
    """One engine's ringer state: per queue ``meta`` table, its watches."""

    def __init__(self) -> None:
        self.queues: dict[str, Sleepers] = {}
        self.warned = False

    def sleepers(self, meta: str) -> Sleepers:
        s = self.queues.get(meta)
        if s is None:
            s = self.queues[meta] = Sleepers()
        return s

    def kill(self, dbapi_conn: Any, due: list[tuple[str, int]]) -> None:
        """End the sleep of each ``(meta, thread id)``: KILL QUERY, after the commit."""
        cur = dbapi_conn.cursor()
        try:
            for meta, thread in due:
                try:
                    cur.execute(f"KILL QUERY {int(thread)}")
                except Exception as exc:
                    code = (getattr(exc, "args", None) or (None,))[0]
                    if code not in (_UNKNOWN, _REFUSED):
                        raise
                    self.sleepers(meta).gone(thread, refused=code == _REFUSED)
                    if code == _REFUSED and not self.warned:
                        self.warned = True
                        log.warning(
                            "KILL QUERY of a bell watch of %s refused (it runs as another "
                            "database user; waking it needs CONNECTION ADMIN or SUPER): that "
                            "worker notices this process's jobs by polling", meta)
        finally:
            cur.close()


def _hook(engine: Engine) -> None:
    """The hooks, once per engine (a user's engine too, where a batch runs inside the user's
    transaction: it rings when the user commits, and KILLs when the connection is returned)."""
    if getattr(engine, "_ajq_bell", None) is not None:
        return
    bell = Bell()

    @event.listens_for(engine, "connect")
    def _connect(_dbapi_conn: Any, record: Any) -> None:
        record.info[_BORN] = time.monotonic()

    @event.listens_for(engine, "commit")
    def _commit(conn: Connection) -> None:
        rings = conn.info.pop(_RING, None)
        if not rings:
            return
        shard = random.randrange(SHARDS)
        born = conn.info.get(_BORN, float("-inf"))
        due: list[tuple[str, int]] = []
        # the DBAPI cursor: no SQLAlchemy execution (and its events) inside the commit; with
        # an async driver its execute awaits in this greenlet
        cur = conn.connection.cursor()
        try:
            for meta in sorted(rings):  # one order: two queues' bells never deadlock
                cur.execute(f"UPDATE `{meta}` SET value = CAST(value AS UNSIGNED) + 1 "
                            f"WHERE name = 'wake:{shard}'")
                due += [(meta, i) for i in bell.sleepers(meta).due(cur, meta, born)]
        finally:
            cur.close()
        if due:
            conn.info[_KILL] = due

    @event.listens_for(engine, "rollback")
    def _rollback(conn: Connection) -> None:
        if not conn.invalidated:  # (an invalidated connection's info went with it)
            conn.info.pop(_RING, None)
            conn.info.pop(_KILL, None)

    @event.listens_for(engine, "checkin")
    def _checkin(dbapi_conn: Any, record: Any) -> None:
        due = record.info.pop(_KILL, None) if record is not None else None
        if not due or dbapi_conn is None:
            return
        try:
            bell.kill(dbapi_conn, due)
        except Exception as exc:  # never fail a release: the watches' sleep runs out instead
            log.debug("bell: KILL QUERY failed (%s)", exc)

    engine._ajq_bell = bell  # type: ignore[attr-defined]

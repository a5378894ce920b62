"""Lease keeping: renew what this worker runs, stop what it may no longer run, release what
it holds without running, and reclaim what dead or frozen workers left.

* ``Leases.heartbeat``: every heartbeat_interval, renew the leases of the jobs running (or
  buffered) here in one short transaction; then stop the attempts whose lease was lost or
  whose cancel was requested, and release orphans (leased to this worker in the database but
  unknown here: a claim whose commit answer was lost).
* ``Leases.guard``: stop an attempt whose lease has gone unrenewed for almost lease_ttl:
  past that point another worker may reclaim it, and a job must not run twice at once.
* ``Reclaimer.run``: expired leases of other workers count as a failed attempt and are
  retried; parts of split releases their worker left are released (see fanout.py).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections import deque
from functools import partial
from typing import Any

from sqlalchemy import Connection, select, update

from .. import external
from .. import schema as S
from ..core import Core
from ..finalize import Outcome
from ..fleet import registration
from ..hooks import JobEvent
from ..logs import brief
from ..sql import lit
from ..timeutil import db_now, utcnow_plus
from .outcomes import Outcomes
from .report import extra, log, report
from .state import WorkerState


class Leases:
    """Heartbeat, lease guard and orphan release of one worker (see the module docstring)."""

    def __init__(self, core: Core, state: WorkerState, outcomes: Outcomes) -> None:
        self.core = core
        self.state = state
        self.outcomes = outcomes
        #: (job, attempt) leased to this worker in the database but unknown here, last beat
        self.orphans: set[tuple[int, int]] = set()

    def healthy(self) -> bool:
        """Leases are renewed: new ones may be taken."""
        s = self.core.settings
        return time.monotonic() - self.state.beat_ok_at < s.lease_ttl - s.margin

    async def heartbeat(self) -> None:
        """Renew the leases of the jobs running here, every heartbeat_interval; then stop the
        ones whose lease was lost or whose cancel was requested, and release orphans.

        It handles database errors itself (a failed beat is retried sooner, never crashes
        the worker); if beats keep failing, ``guard`` stops the jobs before their leases can
        expire, so no job runs on two workers at once."""
        core, state = self.core, self.state
        s = core.settings
        delay = 0.1
        while True:
            t0 = time.monotonic()
            mine = {i: r.claimed.attempt for i, r in state.running.items()}
            # prefetched jobs are leased here too: renew them, never take them for orphans
            mine.update((c.id, c.attempt) for c, _ in state.buffer)
            for q in state.held.values():  # and so are held ones
                mine.update((c.id, c.attempt) for c, _ in q)
            ids = sorted(mine)
            try:
                async with asyncio.timeout(max(s.lease_ttl, 5.0)):  # a hung link is no beat
                    rows = await core.db.write_sync(partial(self._beat, ids=ids))
            except Exception as exc:
                if not core.db.is_outage(exc):
                    raise
                log.warning("heartbeat failed (%s); %d lease(s) not renewed, retrying in "
                            "%.1fs", brief(exc), len(mine), delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, s.heartbeat_interval)
                continue
            if delay > 0.1 and self.outcomes.outbox:
                self.outcomes.event.set()  # the database is back: finalize now
            delay = 0.1
            state.beat_ok_at = t0
            for jid, attempt in mine.items():
                r = state.running.get(jid)
                if r is not None and r.claimed.attempt == attempt:
                    r.renewed_at = max(r.renewed_at, t0)
            await self._reconcile(mine, rows)
            await asyncio.sleep(s.heartbeat_interval)

    def _beat(self, conn: Connection, *, ids: list[int]) -> list[Any]:
        s, t, ops = self.core.settings, self.core.db.t, self.core.db.ops
        J, W = t.jobs, t.workers
        me = s.worker_id
        # Synchronous: on SQLite it runs in a thread, to its end whatever this event loop is
        # doing (see Database.write_sync).
        # Renew only the attempts this process runs: a lease it holds without knowing (a
        # claim whose commit answer was lost) must not be kept alive forever.
        for i in range(0, len(ids), 1000):
            if self.state.held:
                # held rows too: lock in id order, as a round that swaps one in does (a
                # single UPDATE's lock order follows its plan, which may not be by id)
                conn.execute(ops.for_update(select(J.c.id).where(
                    J.c.id.in_(ids[i : i + 1000])).order_by(J.c.id)))
            conn.execute(
                update(J).where(J.c.state.in_([lit(x) for x in S.LEASED_STATES]),
                                J.c.lease_owner == me,
                                J.c.id.in_(ids[i : i + 1000]))
                .values(lease_expires=utcnow_plus(s.lease_ttl))
            )
        # the types, capacity and caps it serves with: for explain() and status
        vals = {"last_seen": db_now(), "running": len(ids),
                **registration(s, self.core.handlers)}
        res = conn.execute(update(W).where(W.c.id == me).values(**vals))
        if res.rowcount == 0:  # first beat (an upsert: a retried first beat must not collide)
            conn.execute(ops.insert_ignore_stmt(W).values(
                id=me, host=socket.gethostname()[:255], pid=os.getpid(),
                started_at=db_now(), **vals))
        rows = conn.execute(
            select(J.c.id, J.c.attempts, J.c.cancel_requested)
            .where(J.c.state.in_([lit(x) for x in S.LEASED_STATES]), J.c.lease_owner == me)
        )
        return list(rows)

    async def _reconcile(self, mine: dict[int, int], rows: list[Any]) -> None:
        """Act on what a beat read (``rows``: this worker's leases in the database) for the
        attempts ``mine`` known before it began: stop the running ones that lost their lease
        or were asked to cancel, drop or give back the held ones likewise, and release the
        leases unknown here on the second beat in a row."""
        held = {r.id: r for r in rows}
        self._stop_lost(mine, held)
        # Held jobs known before the beat: one whose lease was lost is never started here;
        # one whose cancel was requested is given back (its release becomes the cancel).
        back = self._sort_held(mine, held)
        if back:
            await self.give_back(back)
        # Leased to us in the database but not running here (a claim whose commit answer
        # was lost): release them. Seen on two beats in a row with no claim in flight, so a
        # claim that committed but has not started its jobs yet is never mistaken for one.
        unknown = self._unknown(rows)
        if self.state.claiming:
            self.orphans |= unknown
            return
        orphans, self.orphans = sorted(unknown & self.orphans), unknown
        if orphans:
            await self.release_orphans(orphans)

    def _stop_lost(self, mine: dict[int, int], held: dict[int, Any]) -> None:
        """Stop the attempts running here whose lease the beat did not find (``held``: the
        rows it read, by id), or whose cancel was requested."""
        state, me = self.state, self.core.settings.worker_id
        # Only jobs known before the beat began: a claim committed during it is not a loss.
        for jid, attempt in mine.items():
            r = state.running.get(jid)
            key = (jid, attempt)
            if r is None or r.claimed.attempt != attempt or key in state.reasons:
                continue
            if r.outcome_queued or r.task.done():
                continue  # finished; its outcome is on the way
            h = held.get(jid)
            if h is None or h.attempts != attempt:
                log.warning("job %s attempt %s lost its lease; stopping it", jid, attempt,
                            extra=extra(me, r.claimed))
                state.reasons[key] = "lost"
                r.task.cancel()
            elif h.cancel_requested:
                log.info("job %s cancel requested; stopping it", jid,
                         extra=extra(me, r.claimed))
                state.reasons[key] = "cancel"
                r.task.cancel()

    def _sort_held(self, mine: dict[int, int], held: dict[int, Any]) -> list[Any]:
        """Drop from the held queues the jobs known before the beat (``mine``) whose lease
        it did not find (``held``: the rows it read, by id), and take out those whose
        cancel was requested: returned, to be given back."""
        state, me = self.state, self.core.settings.worker_id
        back = []
        for grp, q in list(state.held.items()):
            keep: deque[tuple[Any, float]] = deque()
            for c, t in q:
                h = held.get(c.id)
                if mine.get(c.id) != c.attempt:
                    keep.append((c, t))
                elif h is None or h.attempts != c.attempt:
                    log.warning("held job %s attempt %s lost its lease", c.id, c.attempt,
                                extra=extra(me, c))
                elif h.cancel_requested:
                    back.append(c)
                else:
                    keep.append((c, t))
            if keep:
                state.held[grp] = keep
            else:
                del state.held[grp]
        return back

    def _unknown(self, rows: list[Any]) -> set[tuple[int, int]]:
        """The (job, attempt) of the leases in ``rows`` that this worker neither runs nor
        holds in its buffer or its held queues."""
        state = self.state
        unknown = set()
        buffered = {(c.id, c.attempt) for c, _ in state.buffer}
        for q in state.held.values():
            buffered.update((c.id, c.attempt) for c, _ in q)
        for h in rows:
            r = state.running.get(h.id)
            if (r is None or r.claimed.attempt != h.attempts) and (
                    (h.id, h.attempts) not in buffered):
                unknown.add((h.id, h.attempts))
        return unknown

    async def release_orphans(self, orphans: list[tuple[int, int]]) -> None:
        """Release leases this worker holds without running their jobs."""
        core = self.core
        outs = [Outcome(i, a, core.settings.worker_id, "released") for i, a in orphans]
        fin = core.finalizer
        try:
            done = await core.db.write(lambda conn: fin.finish_detailed(conn, outs))
        except Exception as exc:
            if not core.db.is_outage(exc):
                raise
            log.warning("could not release %d orphaned lease(s) (%s)", len(outs), brief(exc))
            return
        if done:
            log.warning("released %d job(s) leased to this worker but not running here: %s",
                        len(done), [o.job_id for o in done])
            self.orphans -= {(o.job_id, o.attempt) for o in done}
            self.state.wake.set()

    async def give_back(self, claims: list[Any]) -> None:
        """Release held jobs (state ``leased``, never started here): ready again at once,
        the attempt not counted. Where the database is away they stay leased to this
        worker, unknown here: the heartbeat releases them as orphans."""
        core = self.core
        outs = [Outcome(c.id, c.attempt, core.settings.worker_id, "released") for c in claims]
        fin = core.finalizer
        try:
            await core.db.write(lambda conn: fin.finish_detailed(conn, outs))
        except Exception as exc:
            if not core.db.is_outage(exc):
                raise
            log.warning("could not give back %d held job(s) (%s)", len(outs), brief(exc))

    async def release_all_orphans(self) -> None:
        """At shutdown: release every lease this worker holds whose outcome is not queued."""
        core, state = self.core, self.state
        J, me = core.db.t.jobs, core.settings.worker_id

        async def owned(conn: Any) -> list[Any]:
            return list(await conn.execute(
                select(J.c.id, J.c.attempts)
                .where(J.c.state.in_([lit(x) for x in S.LEASED_STATES]),
                       J.c.lease_owner == me)))

        rows = await core.db.read(owned)
        orphans = []
        for row in rows:
            r = state.running.get(row.id)
            if r is None or r.claimed.attempt != row.attempts or (
                    r.task.done() and not r.outcome_queued):
                orphans.append((row.id, row.attempts))
        if orphans:
            await self.release_orphans(orphans)

    async def guard(self) -> None:
        """Stop (and release) a job whose lease has gone unrenewed for almost lease_ttl."""
        s, state = self.core.settings, self.state
        every = min(s.heartbeat_interval / 2, s.lease_ttl / 8)
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            for jid, r in list(state.running.items()):
                key = (jid, r.claimed.attempt)
                if r.outcome_queued or r.task.done() or key in state.reasons:
                    continue
                if now > r.renewed_at + s.lease_ttl - s.margin:
                    log.warning("job %s attempt %s: lease unrenewed for %.1fs; stopping it "
                                "before another worker may reclaim it", jid, r.claimed.attempt,
                                now - r.renewed_at, extra=extra(s.worker_id, r.claimed))
                    state.reasons[key] = "expired"
                    r.task.cancel()


class Reclaimer:
    """Expired leases (dead or frozen workers) count as a failed attempt and are retried."""

    def __init__(self, core: Core, wake: asyncio.Event) -> None:
        self.core = core
        self.wake = wake

    async def run(self) -> None:
        core = self.core
        s, db = core.settings, core.db
        J = db.t.jobs
        # Never our own: we renew what we run, flush what we ran (after an outage the
        # outcome may still be queued here) and release orphans ourselves.
        # (a dead worker's held jobs as well: one may have been started in a freed slot)
        expired = (J.c.state.in_([lit(x) for x in S.LEASED_STATES]), J.c.lease_expires < db_now(),
                   J.c.lease_owner != s.worker_id)

        async def any_expired(conn: Any) -> bool:
            return (await conn.execute(select(J.c.id).where(*expired).limit(1))).first() is not None

        async def sweep(conn: Any) -> list[JobEvent]:
            rows = (await conn.execute(db.ops.skip_locked(
                select(J.c.id, J.c.attempts, J.c.lease_owner, J.c.type, J.c.group_key)
                .where(*expired).order_by(J.c.id).limit(500)
            ))).all()
            outs = [
                Outcome(r.id, r.attempts, r.lease_owner, "failed", error={
                    "type": "LeaseExpired",
                    "message": f"worker {r.lease_owner} stopped renewing its lease "
                               f"(died or froze); attempt {r.attempts} counted as failed"})
                for r in rows
            ]
            info = {r.id: r for r in rows}
            return [
                JobEvent(o.kind, o.job_id, info[o.job_id].type, info[o.job_id].group_key,
                         o.attempt, o.owner, error=o.error, retry_in=o.retry_in,
                         reclaimed=True)
                for o in await core.finalizer.finish_detailed(conn, outs)
            ]

        while True:
            # Look before taking a write transaction: usually nothing has expired, and on
            # SQLite a write transaction holds the file's write lock (a handler that froze
            # this process's event loop meanwhile would keep every other worker out).
            events = await db.write(sweep) if await db.read(any_expired) else []
            # the rest of split releases that their worker left (it died, or its call failed)
            if await core.splits.any_left():
                await core.splits.rest_releases()
            await external.sweep(core)  # external steps past their timeout fail
            if events:
                log.warning("reclaimed %d job(s) with expired leases", len(events),
                            extra={"worker": s.worker_id})
                for ev in events:  # reported once, here: the dead worker cannot
                    report(ev)
                    core.hooks.emit(ev)
                self.wake.set()
            await asyncio.sleep(min(s.lease_ttl / 4, max(s.poll_interval, 0.05) * 5))

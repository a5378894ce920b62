"""The worker: tick loop (reclaim -> promote -> rank -> lease -> dispatch) and its side loops.

Side loops (heartbeat, completion flusher, reclaimer, listener) run in the same TaskGroup as
the tick loop, so a crash in any of them stops serve() loudly instead of silently. Database
outages are absorbed in one place, ``_resilient``: log, back off, try again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Connection, func, select, update

from . import schema as S
from .claim import Claimed, LeaseAsk, asked_claims, claim, lease_ask
from .completer import Outcome, lit
from .executor import Reasons, run_attempt
from .explain import registration
from .hooks import JobEvent
from .limits import local_budget, notify
from .logs import brief
from .periodic import run_schedules
from .timeutil import db_now, utcnow_plus

if TYPE_CHECKING:
    from .queue import JobQueue

log = logging.getLogger("aiojobqueue.worker")
#: One record per attempt start/end; silence it alone to keep warnings but not per-job lines.
jlog = logging.getLogger("aiojobqueue.jobs")
T = TypeVar("T")
#: Prefetch aims to hold about this many seconds of work ahead of the free slots ...
PREFETCH_HORIZON = 0.05
#: ... and never more than this many times its capacity, or PREFETCH_FLOOR jobs if more: a
#: small worker running very short jobs would otherwise pay a round per handful of jobs.
PREFETCH_MAX = 2
PREFETCH_FLOOR = 64


@dataclass
class _Running:
    claimed: Claimed
    task: asyncio.Task[None]
    #: monotonic time at which the last transaction known to have set this lease began: the
    #: lease is certainly valid until renewed_at + lease_ttl (the database clock set it later).
    renewed_at: float
    outcome_queued: bool = False
    started: float = field(default_factory=time.monotonic)


@dataclass
class Worker:
    """The serving side of one JobQueue (one per process)."""

    q: JobQueue
    running: dict[int, _Running] = field(default_factory=dict)
    reasons: Reasons = field(default_factory=dict)
    outbox: list[Outcome] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    outbox_event: asyncio.Event = field(default_factory=asyncio.Event)
    flushed: asyncio.Event = field(default_factory=asyncio.Event)
    flush_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    stopping: bool = False
    idle_exit: bool = False
    claims: int = 0
    #: a claim transaction is in flight (its rows may be committed but not yet started here)
    claiming: bool = False
    #: monotonic start of the last heartbeat that went through
    beat_ok_at: float = 0.0
    #: (job, attempt) leased to this worker in the database but unknown here, seen last beat
    orphans: set[tuple[int, int]] = field(default_factory=set)
    #: outcomes whose last write failed in a way that may still have committed
    uncertain: set[tuple[int, int]] = field(default_factory=set)
    #: consecutive non-retryable write failures of one outcome (a poison outcome)
    poison: dict[tuple[int, int], int] = field(default_factory=dict)
    one_by_one: int = 0
    #: Leased (prefetched) jobs waiting for a free handler slot, with their lease time.
    buffer: deque[tuple[Claimed, float]] = field(default_factory=deque)
    _active: int = 0  # handlers executing now (capacity caps this)
    _avg_run: float | None = None  # moving average of handler run time, seconds
    _backlog: bool = False  # the last claim got all it asked for
    _poked: bool = False  # a notification arrived since the last round
    _pumping: bool = False  # the tick loop runs: it writes outcomes with its rounds

    @property
    def margin(self) -> float:
        """Stop a job this long before its lease could expire if it was not renewed."""
        return min(self.q.heartbeat_interval, self.q.lease_ttl / 4)

    # -- the loop -------------------------------------------------------------------------
    async def serve(self, until_idle: bool = False) -> None:
        q = self.q
        self.idle_exit = until_idle
        self.stopping = False
        self.beat_ok_at = time.monotonic()
        try:
            async with asyncio.TaskGroup() as tg:
                side = [
                    tg.create_task(self._heartbeat_loop()),
                    tg.create_task(self._lease_guard()),
                    tg.create_task(self._flusher()),
                    tg.create_task(self._resilient("reclaim", self._reclaim_loop)),
                ]
                if q._schedules and not until_idle:
                    side.append(tg.create_task(
                        self._resilient("periodic", lambda: run_schedules(q))))
                listener = q._ops.listener(q.engine)
                if listener is not None and not until_idle:
                    side.append(tg.create_task(
                        self._resilient("listen", lambda: listener.run(self._on_notify))))
                try:
                    await self._tick_loop()
                finally:
                    await self._drain()
                    for t in side:  # side loops end with the tick loop
                        t.cancel()
        finally:
            await self._deregister()

    async def _deregister(self) -> None:
        """Leave the worker registry on a clean exit, so ``status`` lists live workers only
        (a worker that dies stays there, its last heartbeat getting older)."""
        W = self.q._t.workers
        try:
            async with asyncio.timeout(5.0):
                await self.q._write(
                    lambda conn: conn.execute(W.delete().where(W.c.id == self.q.worker_id)),
                    retries=2)
        except Exception as exc:  # best effort: the row only ages
            log.debug("could not deregister worker %s: %s", self.q.worker_id, exc)

    async def _tick_loop(self) -> None:
        """The pump: each round is ONE transaction that writes the finished attempts (fenced)
        and leases replacements for the freed slots (plus a short prefetch), so a busy worker
        pays one commit per round, not one per claim and one per flush."""
        q = self.q
        types = sorted(q._handlers)
        delay = 0.0
        self._pumping = True
        try:
            while not self.stopping:
                quick = False
                if delay:
                    # Woken from idle by a notification (an enqueue elsewhere): go straight
                    # for the job (see claim(quick=True)).
                    quick = await self._sleep_or_wake(delay) and self._poked and not self.outbox
                else:
                    await asyncio.sleep(0)  # let just-started handlers run: their slots count
                if self.stopping:
                    break
                self.wake.clear()
                self._poked = False
                want = q.capacity + self._prefetch() - self._active - len(self.buffer)
                want = await local_budget(q._local_limits, want)
                # No new leases while this worker cannot renew the ones it has.
                if not types or not self._leases_healthy():
                    want = 0
                want = max(want, 0)
                if not want and not self.outbox:
                    delay = q.poll_interval  # a finishing job sets `wake`
                    continue
                ok, got = await self._flush(want, types, quick)
                if not ok:
                    delay = min(max(delay * 2, 0.2), 5.0)
                    continue
                if want:
                    self._backlog = len(got) >= want
                self._fill()
                idle_now = (self.idle_exit and not got and not self.running and not self.outbox
                            and not self.buffer)
                if idle_now and await self._idle(types):
                    return
                # A full claim means more may be waiting, and outcomes that arrived meanwhile
                # should be written: go again at once (also when the claim left its look
                # for other groups to the next one).
                delay = (0.0 if (got and len(got) == want) or self.outbox or q._census_due
                         else q.poll_interval)
        finally:
            self._pumping = False

    def _prefetch(self) -> int:
        """Extra jobs to lease ahead of free slots: about what this worker starts within
        PREFETCH_HORIZON at its recent pace, at most PREFETCH_MAX x ``capacity`` (or
        PREFETCH_FLOOR); only while the last claim came back full (a backlog to run through:
        a shallow ready set is left to the other workers). None where a global cap, group cap
        or limit is counted (a prefetched job would hold a scarce slot idle), nor where the
        dialect says so."""
        q = self.q
        if (q._needs_gate or q._local_limits or not q._ops.prefetch or self._avg_run is None
                or not self._backlog):
            return 0
        pace = q.capacity * PREFETCH_HORIZON / max(self._avg_run, 1e-6)
        return min(max(PREFETCH_MAX * q.capacity, PREFETCH_FLOOR), int(pace))

    def _fill(self) -> None:
        """Start leased jobs while handler slots are free."""
        while self.buffer and self._active < self.q.capacity and not self.stopping:
            c, leased_at = self.buffer.popleft()
            self._start(c, leased_at)

    def _leases_healthy(self) -> bool:
        return time.monotonic() - self.beat_ok_at < self.q.lease_ttl - self.margin

    def _retryable(self, exc: BaseException) -> bool:
        """A database outage or conflict (retry) rather than a bug (crash loudly)."""
        from sqlalchemy.exc import InterfaceError, OperationalError

        return self.q._ops.is_transient(exc) or isinstance(
            exc, (OperationalError, InterfaceError, OSError, TimeoutError))

    async def _sleep_or_wake(self, delay: float) -> bool:
        """Sleep up to ``delay``; True if woken before it passed."""
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation
        # that arrives as the wake event fires, and serve() would then never stop.
        try:
            async with asyncio.timeout(delay):
                await self.wake.wait()
        except TimeoutError:
            return False
        return True

    def _on_notify(self, _payload: str) -> None:
        self._poked = True
        self.wake.set()

    def _start(self, c: Claimed, leased_at: float) -> None:
        old = self.running.get(c.id)
        if old is not None and not old.task.done():
            # our earlier attempt was reclaimed (we were too slow to renew) and we claimed the
            # job again before the heartbeat noticed: the old attempt must not run on
            self.reasons.setdefault((c.id, old.claimed.attempt), "lost")
            old.task.cancel()
        self.claims += 1
        self._active += 1
        notify(self.q._local_limits, "on_start", c.type, c.group)
        task = asyncio.create_task(self._run(c), name=f"ajq-job-{c.id}")
        self.running[c.id] = _Running(c, task, leased_at)
        if self.q._hooks or jlog.isEnabledFor(logging.DEBUG):  # (per job: skip if unread)
            ev = JobEvent("start", c.id, c.type, c.group, c.attempt, self.q.worker_id)
            jlog.debug("job %s (%s) attempt %s started", c.id, c.type, c.attempt,
                       extra=ev.log_extra())
            self.q._hooks.emit(ev)

    async def _run(self, c: Claimed) -> None:
        t0 = time.monotonic()
        try:
            outcome = await run_attempt(self.q, c, self.reasons)
        finally:
            self._active -= 1
        took = time.monotonic() - t0
        avg = self._avg_run
        self._avg_run = took if avg is None else avg + (took - avg) * 0.1
        if outcome is None:  # lease lost: another attempt owns the job now
            self._forget(c)
        else:
            r = self.running.get(c.id)
            if r is not None and r.claimed.attempt == c.attempt:
                r.outcome_queued = True
            self.outbox.append(outcome)
            self.outbox_event.set()
            self.wake.set()  # the pump writes it with its next round
        self._fill()

    def _forget(self, c: Claimed) -> None:
        r = self.running.get(c.id)
        if r is not None and r.claimed.attempt == c.attempt:
            del self.running[c.id]
        self.reasons.pop((c.id, c.attempt), None)
        notify(self.q._local_limits, "on_finish", c.type, c.group)
        self.wake.set()

    # -- completions ----------------------------------------------------------------------
    async def _flusher(self) -> None:
        """Write finished attempts in batches: whatever finished while the previous write was
        in flight goes in the next one transaction (no added latency when idle). A failed
        write keeps its outcomes queued (their leases stay renewed) and is retried."""
        delay = 0.05
        while True:
            await self.outbox_event.wait()
            self.outbox_event.clear()
            if self._pumping and not self.claiming:
                continue  # the pump writes outcomes with its next round (fewer commits)
            ok, _ = await self._flush()
            if ok:
                delay = 0.05
                continue
            await asyncio.sleep(delay)
            # short: once the database is back, a lease that expired during the outage is up
            # for grabs by other workers' reclaimers, so the outcome must land quickly
            delay = min(delay * 2, self.q.heartbeat_interval)
            self.outbox_event.set()

    async def _flush(
        self, want: int = 0, types: list[str] | None = None, quick: bool = False
    ) -> tuple[bool, list[Claimed]]:
        """One round of the pump: write the queued outcomes (one fenced finalize; retries=0:
        a retry inside _write would hide a commit whose answer was lost) and, at the same time
        on another connection, lease up to ``want`` jobs of ``types`` (the slots the outcomes
        freed were counted when their handlers returned). Not one transaction for both: a
        round whose commit answer is lost would strand the leases it took until they are
        released as orphans, bumping those jobs' attempt numbers. Except at a DAG step (no
        backlog, and the finalize is one call of the PostgreSQL routine): there the call
        that releases the next jobs leases them too, since the step waits on that round trip
        (a lost answer then costs the same as a lost claim's). (False, got) if a write
        failed: the outcomes stay queued."""
        claiming: asyncio.Future[list[Claimed] | None] | None = None
        ask: LeaseAsk | None = None
        try:
            async with self.flush_lock:
                n = 1 if self.one_by_one else len(self.outbox)
                batch, self.outbox = self.outbox[:n], self.outbox[n:]
                if batch and want and self.q._ops.local_commit:
                    leased: list[Claimed] = []
                    wrote = await self._write_outcomes(batch, partial(
                        self._finalize_and_claim, batch, want, types or [], quick, leased))
                    return wrote, leased
                # With no backlog, a finalize that may release jobs (a dependent, a
                # container's next child) goes first, so this round's claim already sees
                # them: a DAG's critical path takes one round per step, not two. Where the
                # finalize is one call of the routine, that call makes the claim too.
                if want and self.q._ops.parallel_writes and (
                        self._backlog or all(self._alone(o) for o in batch)):
                    claiming = asyncio.ensure_future(self._claim_round(want, types or [], quick))
                if want and batch and claiming is None and self.q._settle_call is not None:
                    ask = lease_ask(self.q, want, types or [], quick)
                wrote = not batch or await self._write_outcomes(
                    batch, partial(self._finalize, batch, ask) if ask else None)
            if ask is not None and ask.rows:
                return wrote, ask.claimed
            if want and claiming is None:
                claiming = asyncio.ensure_future(self._claim_round(want, types or [], quick))
        except asyncio.CancelledError:
            if claiming is not None:  # its leases reach the buffer, for _drain to release
                with contextlib.suppress(Exception):
                    await claiming
            raise
        got = await claiming if claiming is not None else []
        return wrote and got is not None, got or []

    def _alone(self, o: Outcome) -> bool:
        """Whether ``o``'s job had no parent and no dependents when leased: finalizing it
        makes no other job runnable (the finalize re-checks under the row lock)."""
        r = self.running.get(o.job_id)
        return (r is not None and r.claimed.attempt == o.attempt
                and r.claimed.parent_id is None and not r.claimed.has_dependents)

    async def _claim_round(self, want: int, types: list[str], quick: bool) -> list[Claimed] | None:
        """Lease up to ``want`` jobs into the buffer; None if the claim failed (back off).
        In autocommit where the claim is one statement per group (no gate, no counted
        limit): the pick-and-lease UPDATE is atomic by itself."""
        q = self.q
        t0 = time.monotonic()
        self.claiming = True
        run = (q._autocommit if q._ops.autocommit_writes and not q._needs_gate
               and not q._db_limits else q._write)
        # Shielded: a shutdown that lands mid-claim lets it finish, so its leases are not
        # lost (_drain releases what it claimed and did not start).
        write = asyncio.ensure_future(run(partial(_claim, q, want=want, types=types,
                                                  quick=quick)))
        try:
            try:
                got = await asyncio.shield(write)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    self.buffer.extend((c, t0) for c in await write)
                raise
            finally:
                self.claiming = False
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not self._retryable(exc):
                raise
            log.warning("claim failed (%s); backing off", brief(exc), extra={"worker": q.worker_id})
            return None
        self.buffer.extend((c, t0) for c in got)
        return got

    async def _finalize_and_claim(
        self, batch: list[Outcome], want: int, types: list[str], quick: bool,
        got: list[Claimed],
    ) -> list[Outcome]:
        """A round in one transaction, where the database runs in this process (SQLite): no
        commit answer can be lost between the finalize and the claim, so they share one
        commit. The leased jobs go to the buffer (and ``got``) once it has committed."""
        q = self.q
        t0 = time.monotonic()
        taken: list[Claimed] = []

        async def both(conn: Any) -> list[Outcome]:
            applied = await q._completer.finish_detailed(conn, batch)
            taken[:] = await claim(q, conn, want, types, quick)
            return applied

        self.claiming = True
        try:
            applied = await q._write(both, retries=0)
        finally:
            self.claiming = False
        self.buffer.extend((c, t0) for c in taken)
        got.extend(taken)
        return applied

    async def _write_outcomes(
        self, batch: list[Outcome],
        write_fn: Callable[[], Awaitable[list[Outcome]]] | None = None,
    ) -> bool:
        """Write ``batch`` (with ``write_fn`` if given, else _finalize), shielded from a
        shutdown; False if it failed (the outcomes are queued again)."""
        q = self.q
        write = asyncio.ensure_future(write_fn() if write_fn else self._finalize(batch))
        try:
            try:
                applied = await asyncio.shield(write)
            except asyncio.CancelledError:  # shutting down: let the write land first
                try:
                    applied = await write
                except Exception:
                    self.outbox = batch + self.outbox
                else:
                    await self._flushed(batch, applied)
                raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.outbox = batch + self.outbox
            if self._retryable(exc):
                # it may have committed before the link died: check before reporting
                self.uncertain.update((o.job_id, o.attempt) for o in batch)
                log.warning("finalize of %d job(s) failed (%s); retrying", len(batch), brief(exc),
                            extra={"worker": q.worker_id})
            else:
                self._poisoned(batch, exc)
            return False
        await self._flushed(batch, applied)
        return True

    async def _finalize(self, batch: list[Outcome], ask: LeaseAsk | None = None) -> list[Outcome]:
        """Write ``batch``; returns the outcomes that took effect. Where single statements run
        in autocommit, successes without a result of jobs nothing waits on go in one
        statement (completer.finish_fast: one round trip), and where the one-call routine is
        installed (PostgreSQL) so do the other successes, with their results and the release
        of their dependents (completer.finish_in_one_call); the rest, and any of those the
        call skipped, are fenced and settled in one transaction. Not retried (see
        _flush); a failure leaves the whole batch to be written again, and outcomes that did
        commit are then recognised by _committed_before.

        ``ask``: a claim for the routine's call to make too (see claim.LeaseAsk); the jobs it
        leased go to the buffer (and ``ask.claimed``) at once."""
        q = self.q
        plain = ([o for o in batch if o.kind == "done" and o.result is None]
                 if q._ops.autocommit_writes else [])
        fast = [o for o in plain if self._alone(o)]
        one_call: Callable[..., Awaitable[set[tuple[int, int]]]] = q._completer.finish_fast
        riding = None  # the claim the routine's call makes too
        if q._settle_call is not None:
            done = [o for o in batch if o.kind == "done"]
            if len(fast) < len(done):
                # results to store, or a parent or dependents: the routine does it all
                fast, riding = done, ask
                one_call = partial(q._completer.finish_in_one_call, ask=ask)
        if not fast:
            return await q._write(partial(_finish, q, outcomes=batch), retries=0)
        if riding is None:
            took = await q._autocommit(partial(one_call, outcomes=fast))
        else:  # (no claim round runs beside it: see _flush)
            t0 = time.monotonic()
            self.claiming = True  # its leases are no orphans while it is in flight
            try:
                took = await q._autocommit(partial(one_call, outcomes=fast))
            finally:
                self.claiming = False
            if riding.rows is not None:
                riding.claimed = asked_claims(q, riding)
                self.buffer.extend((c, t0) for c in riding.claimed)
        applied = [o for o in fast if (o.job_id, o.attempt) in took]
        rest = [o for o in batch if (o.job_id, o.attempt) not in took]
        if rest:
            applied += await q._write(partial(_finish, q, outcomes=rest), retries=0)
        return applied

    async def _flushed(self, batch: list[Outcome], applied: list[Outcome]) -> None:
        """Bookkeeping after ``batch`` was written: forget, report, wake waiters."""
        q = self.q
        self.one_by_one = max(self.one_by_one - 1, 0)
        eff = {(o.job_id, o.attempt): o for o in applied}  # what actually happened
        hooks = bool(q._hooks)
        ok = set(eff)
        unsure = [o for o in batch if (o.job_id, o.attempt) in self.uncertain - ok]
        if unsure:
            try:
                ok |= await q._read(lambda conn: self._committed_before(conn, unsure))
            except Exception as exc:  # only the report is at stake, not the job
                log.warning("could not check earlier finalize (%s)", exc)
        for o in batch:
            key = (o.job_id, o.attempt)
            self.uncertain.discard(key)
            self.poison.pop(key, None)
            r = self.running.get(o.job_id)
            if r is not None and r.claimed.attempt == o.attempt:
                c = r.claimed
                self._forget(c)
                # an outcome found committed after a lost answer has no detail: as given
                e = eff.get(key, o) if key in ok else None
                kind = e.kind if e is not None else "discarded"
                if not hooks and not jlog.isEnabledFor(_LEVEL.get(kind, logging.INFO)):
                    continue  # nobody reads the event: don't build it (per job)
                ev = JobEvent(
                    kind, c.id, c.type, c.group,
                    c.attempt, q.worker_id, duration=time.monotonic() - r.started,
                    error=o.error, retry_in=e.retry_in if e is not None else None,
                )
                report(ev)
                q._hooks.emit(ev)
            elif key not in ok:
                log.warning("job %s attempt %s: outcome discarded, lease no longer held",
                            o.job_id, o.attempt, extra={"job_id": o.job_id,
                                                        "attempt": o.attempt,
                                                        "worker": q.worker_id})
        q._local_done.set()
        q._local_done = asyncio.Event()
        self.wake.set()
        if self.outbox:
            self.outbox_event.set()  # a partial batch (one by one): go on with the rest
        else:
            self.flushed.set()

    def _poisoned(self, batch: list[Outcome], exc: Exception) -> None:
        """A write that fails for a reason other than the database being away (say, a result
        the column cannot hold) must not block the others, nor strand its job forever."""
        if len(batch) > 1:
            log.error("finalize of %d job(s) failed (%r); writing them one by one", len(batch),
                      exc)
            self.one_by_one = len(batch)
            return
        o = batch[0]
        key = (o.job_id, o.attempt)
        self.poison[key] = self.poison.get(key, 0) + 1
        log.error("job %s attempt %s: finalize failed (%r), try %d", o.job_id, o.attempt, exc,
                  self.poison[key])
        if self.poison[key] >= 3 and (o.error or {}).get("type") != "FinalizeError":
            self.outbox[0] = Outcome(o.job_id, o.attempt, o.owner, "failed", error={
                "type": "FinalizeError",
                "message": f"the {o.kind} outcome could not be recorded: {exc!r}"[:2000]})
            self.poison.pop(key, None)

    async def _committed_before(self, conn: Any, outs: list[Outcome]) -> set[tuple[int, int]]:
        """Which of ``outs`` an earlier, seemingly failed write did commit (its answer was
        lost). Only the attempt's own lease holder can produce these states at this attempt."""
        J = self.q._t.jobs
        rows = {r.id: r for r in await conn.execute(
            select(J.c.id, J.c.attempts, J.c.state, J.c.error, J.c.lease_owner)
            .where(J.c.id.in_(sorted({o.job_id for o in outs}))))}
        out: set[tuple[int, int]] = set()
        for o in outs:
            r = rows.get(o.job_id)
            if r is None or r.attempts != o.attempt or r.state == S.RUNNING:
                continue
            err_type = (r.error or {}).get("type") if isinstance(r.error, dict) else None
            mine = (
                (o.kind == "done" and r.state == S.DONE)
                or (o.kind == "released" and r.state == S.READY)
                or (o.kind == "failed" and r.error == o.error)
                or (o.kind == "cancelled" and r.state == S.CANCELLED
                    and err_type != "LeaseExpired")
            )
            if mine:
                log.warning("job %s attempt %s: finalize had committed though its answer was "
                            "lost", o.job_id, o.attempt)
                out.add((o.job_id, o.attempt))
        return out

    # -- leases ---------------------------------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        """Renew the leases of the jobs running here, every heartbeat_interval; then stop the
        ones whose lease was lost or whose cancel was requested, and release orphans.

        It handles database errors itself (a failed beat is retried sooner, never crashes the
        worker); if beats keep failing, _lease_guard stops the jobs before their leases can
        expire, so no job runs on two workers at once."""
        q = self.q
        delay = 0.1
        while True:
            t0 = time.monotonic()
            mine = {i: r.claimed.attempt for i, r in self.running.items()}
            # prefetched jobs are leased here too: renew them, never take them for orphans
            mine.update((c.id, c.attempt) for c, _ in self.buffer)
            try:
                async with asyncio.timeout(max(q.lease_ttl, 5.0)):  # a hung link is no beat
                    rows = await q._write_sync(partial(self._beat, ids=sorted(mine)))
            except Exception as exc:
                if not self._retryable(exc):
                    raise
                log.warning("heartbeat failed (%s); %d lease(s) not renewed, retrying in %.1fs",
                            brief(exc), len(mine), delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, q.heartbeat_interval)
                continue
            if delay > 0.1 and self.outbox:
                self.outbox_event.set()  # the database is back: finalize now
            delay = 0.1
            self.beat_ok_at = t0
            for jid, attempt in mine.items():
                r = self.running.get(jid)
                if r is not None and r.claimed.attempt == attempt:
                    r.renewed_at = max(r.renewed_at, t0)
            await self._reconcile(mine, rows)
            await asyncio.sleep(q.heartbeat_interval)

    def _beat(self, conn: Connection, *, ids: list[int]) -> list[Any]:
        q = self.q
        J, W = q._t.jobs, q._t.workers
        # Synchronous: on SQLite it runs in a thread, to its end whatever this event loop is
        # doing (see JobQueue._write_sync).
        # Renew only the attempts this process runs: a lease it holds without knowing (a
        # claim whose commit answer was lost) must not be kept alive forever.
        for i in range(0, len(ids), 1000):
            conn.execute(
                update(J).where(J.c.state == lit(S.RUNNING), J.c.lease_owner == q.worker_id,
                                J.c.id.in_(ids[i : i + 1000]))
                .values(lease_expires=utcnow_plus(q.lease_ttl))
            )
        vals = {"last_seen": db_now(), "running": len(ids), **registration(q)}
        res = conn.execute(update(W).where(W.c.id == q.worker_id).values(**vals))
        if res.rowcount == 0:  # first beat (an upsert: a retried first beat must not collide)
            conn.execute(q._ops._insert_ignore(W).values(
                id=q.worker_id, host=socket.gethostname()[:255], pid=os.getpid(),
                started_at=db_now(), **vals))
        rows = conn.execute(
            select(J.c.id, J.c.attempts, J.c.cancel_requested)
            .where(J.c.state == lit(S.RUNNING), J.c.lease_owner == q.worker_id)
        )
        return list(rows)

    async def _reconcile(self, mine: dict[int, int], rows: list[Any]) -> None:
        held = {r.id: r for r in rows}
        # Only jobs known before the beat began: a claim committed during it is not a loss.
        for jid, attempt in mine.items():
            r = self.running.get(jid)
            key = (jid, attempt)
            if r is None or r.claimed.attempt != attempt or key in self.reasons:
                continue
            if r.outcome_queued or r.task.done():
                continue  # finished; its outcome is on the way
            h = held.get(jid)
            if h is None or h.attempts != attempt:
                log.warning("job %s attempt %s lost its lease; stopping it", jid, attempt,
                            extra=_extra(self.q, r.claimed))
                self.reasons[key] = "lost"
                r.task.cancel()
            elif h.cancel_requested:
                log.info("job %s cancel requested; stopping it", jid,
                         extra=_extra(self.q, r.claimed))
                self.reasons[key] = "cancel"
                r.task.cancel()
        # Leased to us in the database but not running here (a claim whose commit answer
        # was lost): release them. Seen on two beats in a row with no claim in flight, so a
        # claim that committed but has not started its jobs yet is never mistaken for one.
        unknown = set()
        buffered = {(c.id, c.attempt) for c, _ in self.buffer}
        for h in rows:
            r = self.running.get(h.id)
            if (r is None or r.claimed.attempt != h.attempts) and (
                    (h.id, h.attempts) not in buffered):
                unknown.add((h.id, h.attempts))
        if self.claiming:
            self.orphans |= unknown
            return
        orphans, self.orphans = sorted(unknown & self.orphans), unknown
        if orphans:
            await self._release_orphans(orphans)

    async def _release_orphans(self, orphans: list[tuple[int, int]]) -> None:
        q = self.q
        outs = [Outcome(i, a, q.worker_id, "released") for i, a in orphans]
        try:
            done = await q._write(partial(_finish, q, outcomes=outs))
        except Exception as exc:
            if not self._retryable(exc):
                raise
            log.warning("could not release %d orphaned lease(s) (%s)", len(outs), exc)
            return
        if done:
            log.warning("released %d job(s) leased to this worker but not running here: %s",
                        len(done), [o.job_id for o in done])
            self.orphans -= {(o.job_id, o.attempt) for o in done}
            self.wake.set()

    async def _lease_guard(self) -> None:
        """Stop (and release) a job whose lease has gone unrenewed for almost lease_ttl: past
        that point another worker may reclaim it, and the job must not run twice at once."""
        q = self.q
        every = min(q.heartbeat_interval / 2, q.lease_ttl / 8)
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            for jid, r in list(self.running.items()):
                key = (jid, r.claimed.attempt)
                if r.outcome_queued or r.task.done() or key in self.reasons:
                    continue
                if now > r.renewed_at + q.lease_ttl - self.margin:
                    log.warning("job %s attempt %s: lease unrenewed for %.1fs; stopping it "
                                "before another worker may reclaim it", jid, r.claimed.attempt,
                                now - r.renewed_at, extra=_extra(q, r.claimed))
                    self.reasons[key] = "expired"
                    r.task.cancel()

    async def _reclaim_loop(self) -> None:
        """Expired leases (dead or frozen workers) count as a failed attempt and are retried."""
        q = self.q
        J = q._t.jobs
        # Never our own: we renew what we run, flush what we ran (after an outage the outcome
        # may still be queued here) and release orphans ourselves.
        expired = (J.c.state == lit(S.RUNNING), J.c.lease_expires < db_now(),
                   J.c.lease_owner != q.worker_id)

        async def any_expired(conn: Any) -> bool:
            return (await conn.execute(select(J.c.id).where(*expired).limit(1))).first() is not None

        while True:
            async def sweep(conn: Any) -> list[JobEvent]:
                rows = (await conn.execute(q._ops.skip_locked(
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
                    for o in await q._completer.finish_detailed(conn, outs)
                ]

            # Look before taking a write transaction: usually nothing has expired, and on
            # SQLite a write transaction holds the file's write lock (a handler that froze
            # this process's event loop meanwhile would keep every other worker out).
            events = await q._write(sweep) if await q._read(any_expired) else []
            # the rest of split releases that their worker left (it died, or its call failed)
            if q._rest_call is not None and await q._read(self._splits_left):
                await q._rest_releases()
            if events:
                log.warning("reclaimed %d job(s) with expired leases", len(events),
                            extra={"worker": q.worker_id})
                for ev in events:  # reported once, here: the dead worker cannot
                    report(ev)
                    q._hooks.emit(ev)
                self.wake.set()
            await asyncio.sleep(min(q.lease_ttl / 4, max(q.poll_interval, 0.05) * 5))

    # -- shutdown and idleness ------------------------------------------------------------
    def hurry(self) -> None:
        """Shutting down: stop waiting for running jobs; cancel and release them now."""
        for jid, r in self.running.items():
            if self.stopping and not r.task.done():
                self.reasons.setdefault((jid, r.claimed.attempt), "shutdown")
                r.task.cancel()

    async def _drain(self) -> None:
        """Stop claiming; give running jobs shutdown_timeout; then cancel and release them.

        Flushes outcomes itself (the flusher may already be gone if a side loop crashed) and
        finally releases any lease this worker holds without running the job."""
        self.stopping = True
        q = self.q
        busy = sum(1 for r in self.running.values() if not r.task.done())
        if busy:  # WARNING: a wait the user sees (logs.py: visible by default)
            log.warning("shutting down: waiting up to %ss for %d running job(s)",
                        q.shutdown_timeout, busy)
        end = time.monotonic() + q.shutdown_timeout
        while True:
            live = [(jid, r) for jid, r in self.running.items() if not r.task.done()]
            now = time.monotonic()
            if not live or now >= end:
                break
            # If the heartbeat is gone (a side loop crashed), leases are not renewed while we
            # wait: stop a job before its lease could expire rather than at shutdown_timeout.
            for jid, r in live:
                if now > r.renewed_at + q.lease_ttl - self.margin:
                    self.reasons.setdefault((jid, r.claimed.attempt), "shutdown")
                    r.task.cancel()
            await asyncio.wait([r.task for _, r in live],
                               timeout=min(end - now, q.heartbeat_interval / 2))
        pending = []
        for jid, r in list(self.running.items()):
            if not r.task.done():
                self.reasons.setdefault((jid, r.claimed.attempt), "shutdown")
                r.task.cancel()
                pending.append(r.task)
        if pending:
            log.warning("shutting down: cancelled %d job(s) still running; they are released "
                        "to run again at once", len(pending))
            await asyncio.wait(pending, timeout=5.0)
        deadline = time.monotonic() + max(self.q.shutdown_timeout, 5.0)
        delay = 0.05
        while time.monotonic() < deadline:
            async with self.flush_lock:  # a write the flusher has in flight must land first
                pass
            if not self.outbox:
                break
            if not (await self._flush())[0]:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
        try:
            await self._release_all_orphans()
        except Exception as exc:  # their leases expire and they are reclaimed
            log.warning("could not release leases at shutdown (%s)", exc)

    async def _release_all_orphans(self) -> None:
        q = self.q
        J = q._t.jobs

        async def owned(conn: Any) -> list[Any]:
            return list(await conn.execute(
                select(J.c.id, J.c.attempts)
                .where(J.c.state == lit(S.RUNNING), J.c.lease_owner == q.worker_id)))

        rows = await q._read(owned)
        orphans = []
        for row in rows:
            r = self.running.get(row.id)
            if r is None or r.claimed.attempt != row.attempts or (
                    r.task.done() and not r.outcome_queued):
                orphans.append((row.id, row.attempts))
        if orphans:
            await self._release_orphans(orphans)

    async def _splits_left(self, conn: Any) -> bool:
        """Whether a split release has parts still to release (completer.SPLIT)."""
        R = self.q._t.releases
        return (await conn.execute(select(R.c.id).limit(1))).first() is not None

    async def _idle(self, types: list[str]) -> bool:
        J = self.q._t.jobs
        q = self.q
        # Jobs recorded by a split release are runnable once it is finished: not idle while
        # one is left (a call releasing it in flight, or one whose worker died: done here).
        if q._rest_call is not None and await q._read(self._splits_left):
            await q._rest_releases()
            return False

        async def check(conn: Any) -> int:
            n = (await conn.execute(
                select(func.count()).select_from(J).where(
                    (J.c.state == lit(S.RUNNING))
                    | ((J.c.state == lit(S.READY)) & J.c.type.in_(types))
                    | ((J.c.state == lit(S.SCHEDULED)) & J.c.type.in_(types) & (J.c.attempts > 0))
                    | ((J.c.state == lit(S.SCHEDULED)) & J.c.type.in_(types)
                       & (J.c.run_after <= db_now()))
                )
            )).scalar_one()
            return int(n)

        return await self.q._read(check) == 0

    async def _resilient(self, name: str, loop: Callable[[], Awaitable[Any]]) -> None:
        """Run a side loop forever; a database outage is logged and retried with backoff."""
        delay = 0.2
        while True:
            try:
                await loop()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not self._retryable(exc):
                    raise
                log.warning("%s: database error (%s); retrying in %.1fs", name, brief(exc), delay,
                            extra={"worker": self.q.worker_id})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)


async def _claim(
    q: JobQueue, conn: Any, *, want: int, types: list[str], quick: bool = False
) -> list[Claimed]:
    return await claim(q, conn, want, types, quick)


async def _finish(q: JobQueue, conn: Any, *, outcomes: list[Outcome]) -> list[Outcome]:
    return await q._completer.finish_detailed(conn, outcomes)


def _extra(q: JobQueue, c: Claimed) -> dict[str, Any]:
    return {"job_id": c.id, "job_type": c.type, "attempt": c.attempt, "worker": q.worker_id,
            "group": c.group}


#: The level report() logs each way an attempt can end at (the others: INFO).
_LEVEL = {"retry": logging.WARNING, "failed": logging.ERROR, "discarded": logging.WARNING}


def report(ev: JobEvent) -> None:
    """Log how an attempt ended: one record at its _LEVEL, with the job fields as ``extra``."""
    level = _LEVEL.get(ev.event, logging.INFO)
    if not jlog.isEnabledFor(level):
        return
    took = f" in {ev.duration:.2f}s" if ev.duration is not None else ""
    err = ev.error or {}
    why = f"{err.get('type', '?')}: {err.get('message', '')}"
    head = f"job {ev.job_id} ({ev.type}) attempt {ev.attempt}"
    args: tuple[Any, ...]
    if ev.event == "retry":
        msg, args = "%s failed%s (%s); retry in %.1fs", (head, took, why, ev.retry_in or 0.0)
    elif ev.event == "failed":
        msg, args = "%s failed for good%s (%s)", (head, took, why)
    elif ev.event == "discarded":
        msg, args = "%s: outcome discarded, lease no longer held", (head,)
    else:
        msg, args = "%s %s%s", (head, ev.event, took)
    jlog.log(level, msg, *args, extra=ev.log_extra())


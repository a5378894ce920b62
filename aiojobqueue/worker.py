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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import func, insert, select, update

from . import schema as S
from .claim import Claimed, claim
from .completer import Outcome, lit
from .executor import run_attempt
from .hooks import JobEvent
from .periodic import run_schedules
from .timeutil import db_now, utcnow_plus

if TYPE_CHECKING:
    from .queue import JobQueue

log = logging.getLogger("aiojobqueue.worker")
#: One record per attempt start/end; silence it alone to keep warnings but not per-job lines.
jlog = logging.getLogger("aiojobqueue.jobs")
T = TypeVar("T")


@dataclass
class _Running:
    claimed: Claimed
    task: asyncio.Task[None]
    outcome_queued: bool = False
    started: float = field(default_factory=time.monotonic)


@dataclass
class Worker:
    """The serving side of one JobQueue (one per process)."""

    q: JobQueue
    running: dict[int, _Running] = field(default_factory=dict)
    reasons: dict[int, str] = field(default_factory=dict)
    outbox: list[Outcome] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    outbox_event: asyncio.Event = field(default_factory=asyncio.Event)
    flushed: asyncio.Event = field(default_factory=asyncio.Event)
    stopping: bool = False
    idle_exit: bool = False
    claims: int = 0

    # -- the loop -------------------------------------------------------------------------
    async def serve(self, until_idle: bool = False) -> None:
        q = self.q
        self.idle_exit = until_idle
        self.stopping = False
        try:
            async with asyncio.TaskGroup() as tg:
                side = [
                    tg.create_task(self._resilient("heartbeat", self._heartbeat_loop)),
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
        q = self.q
        types = sorted(q._handlers)
        delay = 0.0
        while not self.stopping:
            if delay:
                await self._sleep_or_wake(delay)
            self.wake.clear()
            free = q.capacity - len(self.running)
            for lim in q._local_limits:
                free = min(free, await lim.available())
            got: list[Claimed] = []
            if free > 0 and types:
                try:
                    got = await q._write(partial(_claim, q, want=free, types=types))
                except Exception as exc:
                    if not q._ops.is_transient(exc) and not _is_db_error(exc):
                        raise
                    log.warning("claim failed (%s); backing off", exc,
                                extra={"worker": q.worker_id})
                    delay = min(max(delay * 2, 0.2), 5.0)
                    continue
            for c in got:
                self._start(c)
            idle_now = self.idle_exit and not got and not self.running and not self.outbox
            if idle_now and await self._idle(types):
                return
            # A full claim means more may be waiting: go again at once.
            delay = 0.0 if got and len(got) == free else q.poll_interval

    async def _sleep_or_wake(self, delay: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout=delay)

    def _on_notify(self, _payload: str) -> None:
        self.wake.set()

    def _start(self, c: Claimed) -> None:
        self.claims += 1
        for lim in self.q._local_limits:
            lim.on_start(c.type, c.group)
        task = asyncio.create_task(self._run(c), name=f"ajq-job-{c.id}")
        self.running[c.id] = _Running(c, task)
        ev = JobEvent("start", c.id, c.type, c.group, c.attempt, self.q.worker_id)
        jlog.debug("job %s (%s) attempt %s started", c.id, c.type, c.attempt,
                   extra=ev.log_extra())
        self.q._hooks.emit(ev)

    async def _run(self, c: Claimed) -> None:
        outcome = await run_attempt(self.q, c, self.reasons)
        if outcome is None:  # lease lost: another attempt owns the job now
            self._forget(c)
            return
        self.outbox.append(outcome)
        self.outbox_event.set()

    def _forget(self, c: Claimed) -> None:
        r = self.running.get(c.id)
        if r is not None and r.claimed.attempt == c.attempt:
            del self.running[c.id]
        self.reasons.pop(c.id, None)
        for lim in self.q._local_limits:
            lim.on_finish(c.type, c.group)
        self.wake.set()

    # -- completions ----------------------------------------------------------------------
    async def _flusher(self) -> None:
        """Write finished attempts in batches: whatever finished while the previous write was
        in flight goes in the next one transaction (no added latency when idle)."""
        q = self.q
        delay = 0.05
        while True:
            await self.outbox_event.wait()
            self.outbox_event.clear()
            batch, self.outbox = self.outbox, []
            if not batch:
                continue
            try:
                applied = await q._write(partial(_finish, q, outcomes=batch))
                delay = 0.05
            except Exception as exc:  # keep them: leases stay renewed while we retry
                log.warning("finalize of %d job(s) failed (%s); retrying", len(batch), exc,
                            extra={"worker": q.worker_id})
                self.outbox = batch + self.outbox
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                self.outbox_event.set()
                continue
            ok = {(o.job_id, o.attempt): o for o in applied}
            for o in batch:
                r = self.running.get(o.job_id)
                if r is not None and r.claimed.attempt == o.attempt:
                    self._forget(r.claimed)
                    c = r.claimed
                    eff = ok.get((o.job_id, o.attempt))
                    ev = JobEvent(
                        eff.kind if eff is not None else "discarded", c.id, c.type, c.group,
                        c.attempt, q.worker_id, duration=time.monotonic() - r.started,
                        error=o.error, retry_in=eff.retry_in if eff is not None else None,
                    )
                    report(ev)
                    q._hooks.emit(ev)
                elif (o.job_id, o.attempt) not in ok:
                    log.warning("job %s attempt %s: outcome discarded, lease no longer held",
                                o.job_id, o.attempt, extra={"job_id": o.job_id,
                                                            "attempt": o.attempt,
                                                            "worker": q.worker_id})
            q._local_done.set()
            q._local_done = asyncio.Event()
            self.wake.set()
            if not self.outbox:
                self.flushed.set()

    # -- leases ---------------------------------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        q = self.q
        J, W = q._t.jobs, q._t.workers
        registered = False
        while True:
            mine = {i: r.claimed.attempt for i, r in self.running.items()}

            async def beat(conn: Any, mine: dict[int, int] = mine) -> list[Any]:
                nonlocal registered
                if mine:
                    await conn.execute(
                        update(J).where(J.c.state == lit(S.RUNNING), J.c.lease_owner == q.worker_id)
                        .values(lease_expires=utcnow_plus(q.lease_ttl))
                    )
                vals = {"last_seen": db_now(), "running": len(mine)}
                if registered:
                    await conn.execute(update(W).where(W.c.id == q.worker_id).values(**vals))
                else:
                    await conn.execute(insert(W).values(
                        id=q.worker_id, host=socket.gethostname()[:255], pid=os.getpid(),
                        started_at=db_now(), **vals))
                    registered = True
                if not mine:
                    return []
                rows = await conn.execute(
                    select(J.c.id, J.c.attempts, J.c.cancel_requested)
                    .where(J.c.state == lit(S.RUNNING), J.c.lease_owner == q.worker_id)
                )
                return list(rows)

            rows = await q._write(beat)
            held = {r.id: r for r in rows}
            for jid, attempt in mine.items():
                r = self.running.get(jid)
                if r is None or r.claimed.attempt != attempt or jid in self.reasons:
                    continue
                h = held.get(jid)
                if any(o.job_id == jid for o in self.outbox):
                    continue  # finished; its outcome is on the way
                if h is None or h.attempts != attempt:
                    log.warning("job %s attempt %s lost its lease; stopping it", jid, attempt,
                                extra=_extra(q, r.claimed))
                    self.reasons[jid] = "lost"
                    r.task.cancel()
                elif h.cancel_requested:
                    log.info("job %s cancel requested; stopping it", jid,
                             extra=_extra(q, r.claimed))
                    self.reasons[jid] = "cancel"
                    r.task.cancel()
            await asyncio.sleep(q.heartbeat_interval)

    async def _reclaim_loop(self) -> None:
        """Expired leases (dead or frozen workers) count as a failed attempt and are retried."""
        q = self.q
        J = q._t.jobs
        while True:
            async def sweep(conn: Any) -> list[JobEvent]:
                rows = (await conn.execute(q._ops.skip_locked(
                    select(J.c.id, J.c.attempts, J.c.lease_owner, J.c.type, J.c.group_key)
                    .where(J.c.state == lit(S.RUNNING), J.c.lease_expires < db_now())
                    .order_by(J.c.id).limit(500)
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

            events = await q._write(sweep)
            if events:
                log.warning("reclaimed %d job(s) with expired leases", len(events),
                            extra={"worker": q.worker_id})
                for ev in events:
                    report(ev)
                    q._hooks.emit(ev)
                self.wake.set()
            await asyncio.sleep(min(q.lease_ttl / 4, max(q.poll_interval, 0.05) * 5))

    # -- shutdown and idleness ------------------------------------------------------------
    async def _drain(self) -> None:
        """Stop claiming; give running jobs shutdown_timeout; then cancel and release them."""
        self.stopping = True
        tasks = [r.task for r in self.running.values()]
        if tasks:
            log.info("shutting down: waiting up to %ss for %d job(s)", self.q.shutdown_timeout,
                     len(tasks))
            _, pending = await asyncio.wait(tasks, timeout=self.q.shutdown_timeout)
            for t in pending:
                jid = next((i for i, r in self.running.items() if r.task is t), None)
                if jid is not None:
                    self.reasons[jid] = "shutdown"
                t.cancel()
            if pending:
                await asyncio.wait(pending, timeout=5.0)
        # let the flusher write what finished (or was released) before the side loops stop
        deadline = time.monotonic() + max(self.q.shutdown_timeout, 5.0)
        while self.running and time.monotonic() < deadline:
            self.outbox_event.set()
            self.flushed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.flushed.wait(), timeout=0.2)

    async def _idle(self, types: list[str]) -> bool:
        J = self.q._t.jobs

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
                if not self.q._ops.is_transient(exc) and not _is_db_error(exc):
                    raise
                log.warning("%s: database error (%s); retrying in %.1fs", name, exc, delay,
                            extra={"worker": self.q.worker_id})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)


async def _claim(q: JobQueue, conn: Any, *, want: int, types: list[str]) -> list[Claimed]:
    return await claim(q, conn, want, types)


async def _finish(q: JobQueue, conn: Any, *, outcomes: list[Outcome]) -> list[Outcome]:
    return await q._completer.finish_detailed(conn, outcomes)


def _extra(q: JobQueue, c: Claimed) -> dict[str, Any]:
    return {"job_id": c.id, "job_type": c.type, "attempt": c.attempt, "worker": q.worker_id,
            "group": c.group}


def report(ev: JobEvent) -> None:
    """Log how an attempt ended: one record, with the job fields as ``extra``."""
    x = ev.log_extra()
    took = f" in {ev.duration:.2f}s" if ev.duration is not None else ""
    err = ev.error or {}
    why = f"{err.get('type', '?')}: {err.get('message', '')}"
    head = f"job {ev.job_id} ({ev.type}) attempt {ev.attempt}"
    if ev.event == "done":
        jlog.info("%s done%s", head, took, extra=x)
    elif ev.event == "retry":
        jlog.warning("%s failed%s (%s); retry in %.1fs", head, took, why, ev.retry_in or 0.0,
                     extra=x)
    elif ev.event == "failed":
        jlog.error("%s failed for good%s (%s)", head, took, why, extra=x)
    elif ev.event == "discarded":
        jlog.warning("%s: outcome discarded, lease no longer held", head, extra=x)
    else:
        jlog.info("%s %s%s", head, ev.event, took, extra=x)


def _is_db_error(exc: BaseException) -> bool:
    from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

    return isinstance(exc, (OperationalError, InterfaceError, DBAPIError, OSError))

"""The outcome pipeline: finished attempts wait in the outbox until a round writes them.

The tick loop writes the outbox with each round (see rounds.py); while it waits on a claim,
the flusher writes it alone, so a finished attempt never waits on a slow claim. A write that
fails keeps its outcomes queued (their leases stay renewed) and is tried again: one that
may have committed before the link died is *uncertain* and checked before it is reported;
one that fails for another reason (a result the column cannot hold) is *poison*: a batch is
then written one by one, and an outcome that fails three times is recorded as a failure.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from .. import schema as S
from ..core import Core
from ..finalize import Outcome
from ..hooks import JobEvent
from ..logs import brief
from .report import LEVEL, jlog, log, report
from .state import WorkerState

#: writes a batch of outcomes; returns those that took effect (see rounds.py)
Finalize = Callable[[list[Outcome], Any], Awaitable[list[Outcome]]]


class Outcomes:
    """The outbox and how it is written (see the module docstring)."""

    def __init__(self, core: Core, state: WorkerState,
                 forget: Callable[[Any], None]) -> None:
        self.core = core
        self.state = state
        self.forget = forget  # frees the attempt's slot
        self.outbox: list[Outcome] = []
        self.event = asyncio.Event()  # something was added to the outbox
        self.flushed = asyncio.Event()  # the outbox was written empty
        self.lock = asyncio.Lock()  # one write of outcomes at a time
        #: outcomes whose last write failed in a way that may still have committed
        self.uncertain: set[tuple[int, int]] = set()
        #: consecutive non-retryable write failures of one outcome (a poison outcome)
        self.poison: dict[tuple[int, int], int] = {}
        self.one_by_one = 0
        #: the tick loop runs: it writes outcomes with its rounds
        self.pumping = False
        #: the round's finalize (bound by the worker once its round exists)
        self.finalize: Finalize | None = None
        #: monotonic time the oldest outcome in the outbox was queued (see pacing.hold)
        self.queued_at = 0.0

    def add(self, outcome: Outcome) -> None:
        if not self.outbox:
            self.queued_at = time.monotonic()
        self.outbox.append(outcome)
        self.event.set()

    def take(self) -> list[Outcome]:
        """The next batch to write (under ``lock``): everything, or one while one by one."""
        n = 1 if self.one_by_one else len(self.outbox)
        batch, self.outbox = self.outbox[:n], self.outbox[n:]
        return batch

    async def flush(self, beside_pump: bool = False) -> bool:
        """Write the next batch alone (no claim); False if the write failed.
        ``beside_pump``: not if the pump's claim ended while this waited for the lock (its
        next round writes them, with a claim: see flusher)."""
        assert self.finalize is not None
        async with self.lock:
            if beside_pump and self.pumping and not self.state.claiming:
                return True
            batch = self.take()
            return not batch or await self.write(batch, partial(self.finalize, batch, None))

    async def flusher(self) -> None:
        """Write finished attempts in batches: whatever finished while the previous write was
        in flight goes in the next one transaction (no added latency when idle). A failed
        write keeps its outcomes queued (their leases stay renewed) and is retried."""
        delay = 0.05
        while True:
            await self.event.wait()
            self.event.clear()
            if self.pumping and not self.state.claiming:
                continue  # the pump writes outcomes with its next round (fewer commits)
            if await self.flush(beside_pump=True):
                delay = 0.05
                continue
            await asyncio.sleep(delay)
            # short: once the database is back, a lease that expired during the outage is
            # up for grabs by other workers' reclaimers, so the outcome must land quickly
            delay = min(delay * 2, self.core.settings.heartbeat_interval)
            self.event.set()

    async def write(self, batch: list[Outcome],
                    write_fn: Callable[[], Awaitable[list[Outcome]]]) -> bool:
        """Write ``batch`` by ``write_fn``, shielded from a shutdown; False if it failed (the
        outcomes are queued again)."""
        write = asyncio.ensure_future(write_fn())
        try:
            try:
                applied = await asyncio.shield(write)
            except asyncio.CancelledError:  # shutting down: let the write land first
                try:
                    applied = await write
                except Exception:
                    self.outbox = batch + self.outbox
                else:
                    await self._written(batch, applied)
                raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.outbox = batch + self.outbox
            if self.core.db.is_outage(exc):
                # it may have committed before the link died: check before reporting
                self.uncertain.update((o.job_id, o.attempt) for o in batch)
                log.warning("finalize of %d job(s) failed (%s); retrying", len(batch), brief(exc),
                            extra={"worker": self.core.settings.worker_id})
            else:
                self._poisoned(batch, exc)
            return False
        await self._written(batch, applied)
        return True

    async def _written(self, batch: list[Outcome], applied: list[Outcome]) -> None:
        """Bookkeeping after ``batch`` was written: forget, report, wake waiters."""
        core, state = self.core, self.state
        me = core.settings.worker_id
        self.one_by_one = max(self.one_by_one - 1, 0)
        eff = {(o.job_id, o.attempt): o for o in applied}  # what actually happened
        hooks = bool(core.hooks)
        ok = set(eff)
        unsure = [o for o in batch if (o.job_id, o.attempt) in self.uncertain - ok]
        if unsure:
            try:
                ok |= await core.db.read(lambda conn: self._committed_before(conn, unsure))
            except Exception as exc:  # only the report is at stake, not the job
                log.warning("could not check earlier finalize (%s)", brief(exc))
        for o in batch:
            key = (o.job_id, o.attempt)
            self.uncertain.discard(key)
            self.poison.pop(key, None)
            r = state.running.get(o.job_id)
            if r is not None and r.claimed.attempt == o.attempt:
                c = r.claimed
                self.forget(c)
                # an outcome found committed after a lost answer has no detail: as given
                e = eff.get(key, o) if key in ok else None
                kind = e.kind if e is not None else "discarded"
                if not hooks and not jlog.isEnabledFor(LEVEL.get(kind, logging.INFO)):
                    continue  # nobody reads the event: don't build it (per job)
                ev = JobEvent(
                    kind, c.id, c.type, c.group,
                    c.attempt, me, duration=time.monotonic() - r.started,
                    error=o.error, retry_in=e.retry_in if e is not None else None,
                )
                report(ev)
                core.hooks.emit(ev)
            elif key not in ok:
                log.warning("job %s attempt %s: outcome discarded, lease no longer held",
                            o.job_id, o.attempt, extra={"job_id": o.job_id,
                                                        "attempt": o.attempt,
                                                        "worker": me})
        core.signals.finished()
        state.wake.set()
        if self.outbox:
            self.event.set()  # a partial batch (one by one): go on with the rest
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
        from sqlalchemy import select

        J = self.core.db.t.jobs
        rows = {r.id: r for r in await conn.execute(
            select(J.c.id, J.c.attempts, J.c.state, J.c.error, J.c.lease_owner)
            .where(J.c.id.in_(sorted({o.job_id for o in outs}))))}
        out: set[tuple[int, int]] = set()
        for o in outs:
            r = rows.get(o.job_id)
            if r is None or r.attempts != o.attempt or r.state in S.LEASED_STATES:
                continue
            err_type = (r.error or {}).get("type") if isinstance(r.error, dict) else None
            mine = (
                (o.kind == "done" and r.state == S.DONE)
                or (o.kind == "released" and r.state == S.READY)
                or (o.kind == "snoozed" and r.state == S.SCHEDULED)
                or (o.kind == "failed" and r.error == o.error)
                or (o.kind == "cancelled" and r.state == S.CANCELLED
                    and err_type != "LeaseExpired")
            )
            if mine:
                log.warning("job %s attempt %s: finalize had committed though its answer was "
                            "lost", o.job_id, o.attempt)
                out.add((o.job_id, o.attempt))
        return out

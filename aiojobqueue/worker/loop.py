"""The worker: the tick loop (wait, budget, round, dispatch) and its side loops.

Side loops (heartbeat, lease guard, outcome flusher, reclaimer, schedules, listener) run in
the same TaskGroup as the tick loop, so a crash in any of them stops serve() loudly instead
of silently; database outages are absorbed by ``Database.resilient``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any

from sqlalchemy import func, select

from .. import schema as S
from .. import share, threads
from ..claimed import Claimed
from ..core import Core
from ..executor import run_attempt
from ..hooks import JobEvent
from ..limits import local_budget, notify
from ..logs import brief
from ..periodic import run_schedules
from ..retention import Sweeper
from ..sql import lit
from ..stored_policy import NOTIFY_PAYLOAD
from ..timeutil import db_now
from . import pacing, shutdown
from .holding import Holding
from .leases import Leases, Reclaimer
from .outcomes import Outcomes
from .pg_rounds import AutocommitRound, RoutineRound
from .report import jlog
from .rounds import ParallelRound, SharedRound
from .state import Running, WorkerState

#: seconds until the next look after a claim was passed over (the 1st, 2nd, 3rd time in a
#: row: the other claim ends in milliseconds unless the database is loaded); then the poll
RELOOK = (0.003, 0.01, 0.03, 0.2, 2.0)
policy_log = logging.getLogger("aiojobqueue.policy")

#: the round strategies by the name a dialect gives (``DialectOps.round_kind``)
ROUNDS: dict[str, type[ParallelRound]] = {
    "parallel": ParallelRound, "shared": SharedRound,
    "autocommit": AutocommitRound, "routine": RoutineRound,
}


class Worker:
    """The serving side of one queue (one per process)."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.state = WorkerState()
        self.outcomes = Outcomes(core, self.state, self._forget)
        self.round = ROUNDS[core.round_kind](core, self.state, self.outcomes)
        self.outcomes.finalize = self.round.finalize
        self.leases = Leases(core, self.state, self.outcomes)
        self.holding = Holding(self)
        self.wake = self.state.wake
        self.claims = 0  # attempts started
        self._active = 0  # handlers executing now (capacity caps this)
        self._poked = False  # a notification arrived since the last round
        self.pacer = pacing.Pacer()
        self._idle_exit = False

    async def serve(self, until_idle: bool = False) -> None:
        """Run jobs until cancelled (or, ``until_idle``, until nothing is left to run)."""
        core, state = self.core, self.state
        db = core.db
        self._idle_exit = until_idle
        state.stopping = False
        state.beat_ok_at = time.monotonic()
        core.signals.worker = state.wake
        try:
            async with asyncio.TaskGroup() as tg:
                side = [
                    tg.create_task(self.leases.heartbeat()),
                    tg.create_task(self.leases.guard()),
                    tg.create_task(self.outcomes.flusher()),
                    tg.create_task(db.resilient("reclaim", Reclaimer(core, state.wake).run)),
                    tg.create_task(db.resilient("share", lambda: share.watch(core, state))),
                ]
                if not until_idle:  # one worker at a time sweeps (it takes a lease)
                    side.append(tg.create_task(db.resilient("retention", Sweeper(db).run)))
                if core.schedules and not until_idle:
                    side.append(tg.create_task(db.resilient(
                        "periodic", lambda: run_schedules(
                            core.db, core.schedules, core.batch_on, clock=core.schedule_clock,
                            poll=core.settings.poll_interval))))
                listener = db.ops.listener(db.engine)
                if listener is not None and not until_idle:
                    # while its claims come back full the worker claims again at once: a
                    # wake-up would change nothing (a polling bell watch looks less often)
                    listener.set_busy(lambda: state.backlog and not state.stopping)
                    side.append(tg.create_task(db.resilient(
                        "listen", lambda: listener.run(self._on_notify))))
                try:
                    await self._tick_loop()
                finally:
                    await shutdown.drain(core, state, self.outcomes, self.leases)
                    for t in side:  # side loops end with the tick loop
                        t.cancel()
        finally:
            core.signals.worker = None
            await shutdown.deregister(core)

    def hurry(self) -> None:
        """Shutting down: stop waiting for running jobs; cancel and release them now."""
        shutdown.hurry(self.state)

    async def _tick_loop(self) -> None:
        """The pump: each round writes the finished attempts (fenced) and leases
        replacements for the freed slots (plus a short prefetch), so a busy worker pays
        about one commit per round, not one per claim and one per flush (see rounds.py)."""
        s, state, out, rnd = self.core.settings, self.state, self.outcomes, self.round
        types = sorted(self.core.handlers)
        delay = 0.0
        relooks = 0  # claims in a row that were passed over (Claimer.passed_over)
        out.pumping = True
        try:
            while not state.stopping:
                quick = await self._pause(delay, relooks)
                if state.stopping:
                    break
                state.wake.clear()
                self._poked = False
                if self.core.claimer.live.due(time.monotonic()):
                    await self._refresh_policy()
                if state.held:
                    await self.holding.give_back()
                usual = s.capacity + rnd.prefetch(self.state.avg_run)
                want = await self._budget(types, usual)
                if not want and not out.outbox:
                    delay = s.poll_interval  # a finishing job sets `wake`
                    continue
                held = self.pacer.hold(state, out.outbox, out.queued_at, s.capacity, usual,
                                       self.state.avg_run, want, time.monotonic(),
                                       rnd.hold_scale) \
                    if rnd.holds else 0.0
                if held > 0:
                    delay = held  # woken by each finishing job, to look again
                    continue
                t0 = time.monotonic()
                ok, got = await rnd.run(want, types, quick)
                self.pacer.ran(time.monotonic() - t0)
                if not ok:
                    delay = min(max(delay * 2, 0.2), 5.0)
                    continue
                if want:
                    state.backlog = len(got) >= want
                self._fill()
                if state.held:
                    self.holding.start_waiting()
                if (self._idle_exit and not got and not state.running and not out.outbox
                        and not state.buffer and await self._idle(types)):
                    return
                delay, relooks = self._next_delay(want, got, relooks)
        finally:
            out.pumping = False

    async def _pause(self, delay: float, relooks: int) -> bool:
        """Before a round: wait up to ``delay`` seconds for a wake-up, or (no delay) just let
        the handlers started last round run. Returns whether the claim goes straight for
        the job (``quick``, see Claimer.claim)."""
        out = self.outcomes
        if not delay:
            await asyncio.sleep(0)  # let just-started handlers run: their slots count
            return False
        # Woken from idle by a notification (an enqueue elsewhere): go straight
        # for the job (see Claimer.claim(quick=True)).
        quick = await self._sleep_or_wake(delay) and self._poked and not out.outbox
        # a look again after a pass-over goes straight for the row it missed
        return quick or (0 < relooks <= len(RELOOK) and not out.outbox)

    async def _budget(self, types: list[str], usual: int) -> int:
        """How many jobs this round may lease: ``usual`` (capacity and prefetch) less the
        slots taken and the jobs buffered, within this process's share and local limits;
        none while the leases held cannot be renewed."""
        s, state = self.core.settings, self.state
        lingering = threads.lingering(self.core)
        want = usual - self._active - len(state.buffer) - lingering
        if state.share is not None:  # other processes serve these types too
            want = min(want, state.share - self._active - len(state.buffer)
                       - lingering)
        want = await local_budget(s.local_limits, want)
        # No new leases while this worker cannot renew the ones it has.
        if not types or not self.leases.healthy():
            want = 0
        return max(want, 0)

    def _next_delay(self, want: int, got: list[Claimed], relooks: int) -> tuple[float, int]:
        """After a round that leased ``got`` of ``want``: the delay before the next round,
        and the count of claims passed over in a row (``relooks`` before this one)."""
        out, claimer = self.outcomes, self.core.claimer
        # A full claim means more may be waiting, and outcomes that arrived meanwhile
        # should be written: go again at once (also when the claim left its look
        # for other groups to the next one).
        delay = (0.0 if (got and len(got) == want) or out.outbox
                 or claimer.census_due else self.core.settings.poll_interval)
        if want and not got and claimer.passed_over:
            # a ready row was held by another claim's pick: free again in a moment
            if relooks < len(RELOOK):
                delay = RELOOK[relooks]
            return delay, relooks + 1
        return delay, 0

    # -- dispatch -------------------------------------------------------------------------
    def _fill(self) -> None:
        """Start leased jobs while handler slots are free."""
        state, cap = self.state, self.core.settings.capacity - threads.lingering(self.core)
        while state.buffer and self._active < cap and not state.stopping:
            c, leased_at = state.buffer.popleft()
            self._start(c, leased_at)

    def _start(self, c: Claimed, leased_at: float) -> None:
        core, state = self.core, self.state
        old = state.running.get(c.id)
        if old is not None and not old.task.done():
            # our earlier attempt was reclaimed (we were too slow to renew) and we claimed the
            # job again before the heartbeat noticed: the old attempt must not run on
            state.reasons.setdefault((c.id, old.claimed.attempt), "lost")
            old.task.cancel()
        self.claims += 1
        self._active += 1
        if core.settings.local_limits:  # (per job: no call where there is none)
            notify(core.settings.local_limits, "on_start", c.type, c.group)
        task = asyncio.create_task(self._run(c), name=f"ajq-job-{c.id}")
        state.running[c.id] = Running(c, task, leased_at)
        if core.hooks or jlog.isEnabledFor(logging.DEBUG):  # (per job: skip if unread)
            ev = JobEvent("start", c.id, c.type, c.group, c.attempt, core.settings.worker_id)
            jlog.debug("job %s (%s) attempt %s started", c.id, c.type, c.attempt,
                       extra=ev.log_extra())
            core.hooks.emit(ev)

    async def _run(self, c: Claimed) -> None:
        t0 = time.monotonic()
        try:
            outcome = await run_attempt(self.core, c, self.state.reasons)
        finally:
            self._active -= 1
        took = time.monotonic() - t0
        avg = self.state.avg_run
        self.state.avg_run = took if avg is None else avg + (took - avg) * 0.1
        if outcome is None:  # lease lost: another attempt owns the job now
            self._forget(c)
        else:
            r = self.state.running.get(c.id)
            if r is not None and r.claimed.attempt == c.attempt:
                r.outcome_queued = True
            nxt = self.holding.next_for(c)
            if nxt is not None:  # its row becomes running where this outcome is written
                outcome = replace(outcome, swap=(nxt[0].id, nxt[0].attempt))
            self.outcomes.add(outcome)
            if nxt is not None:
                self._start(*nxt)
            self.state.wake.set()  # the pump writes it with its next round
        self._fill()

    def _forget(self, c: Claimed) -> None:
        state = self.state
        r = state.running.get(c.id)
        if r is not None and r.claimed.attempt == c.attempt:
            del state.running[c.id]
        state.reasons.pop((c.id, c.attempt), None)
        if self.core.settings.local_limits:
            notify(self.core.settings.local_limits, "on_finish", c.type, c.group)
        state.wake.set()

    # -- waiting --------------------------------------------------------------------------
    async def _sleep_or_wake(self, delay: float) -> bool:
        """Sleep up to ``delay``; True if woken before it passed."""
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation
        # that arrives as the wake event fires, and serve() would then never stop.
        try:
            async with asyncio.timeout(delay):
                await self.state.wake.wait()
        except TimeoutError:
            return False
        return True

    def _on_notify(self, payload: str) -> None:
        if payload == NOTIFY_PAYLOAD:  # the policy changed: read it before the next claim
            self.core.claimer.live.stale = True
        self._poked = True
        self.state.wake.set()

    async def _refresh_policy(self) -> None:
        """Read the stored policy again where it may have changed (LivePolicy.refresh);
        an outage keeps the policy last read (logged), and the tick goes on."""
        core = self.core
        try:
            live = core.claimer.live
            if await live.refresh(core.db):
                policy_log.info("policy changed (generation %d): %r", live.generation,
                                live.policy, extra={"worker": core.settings.worker_id,
                                                    "policy": live.policy})
        except Exception as exc:
            if not core.db.is_outage(exc):
                raise
            policy_log.warning("policy: could not read it (%s); keeping the last one", brief(exc),
                         extra={"worker": core.settings.worker_id})

    async def _idle(self, types: list[str]) -> bool:
        """Nothing this process can run is runnable and nothing is in flight anywhere."""
        core = self.core
        J = core.db.t.jobs
        types = core.claimer.live.types(types)  # (a paused type's jobs are not runnable)
        # Jobs recorded by a split release are runnable once it is finished: not idle while
        # one is left (a call releasing it in flight, or one whose worker died: done here).
        if await core.splits.any_left():
            await core.splits.rest_releases()
            return False

        async def check(conn: Any) -> int:
            n = (await conn.execute(
                select(func.count()).select_from(J).where(
                    J.c.state.in_([lit(x) for x in S.LEASED_STATES])
                    | ((J.c.state == lit(S.READY)) & J.c.type.in_(types))
                    # a retry in backoff (a snooze is a delay, as run_after is: snooze.py)
                    | ((J.c.state == lit(S.SCHEDULED)) & J.c.type.in_(types)
                       & (J.c.attempts > J.c.snoozes))
                    | ((J.c.state == lit(S.SCHEDULED)) & J.c.type.in_(types)
                       & (J.c.run_after <= db_now()))
                )
            )).scalar_one()
            return int(n)

        return await core.db.read(check) == 0

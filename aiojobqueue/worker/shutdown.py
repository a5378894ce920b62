"""Shutdown: stop claiming, give running jobs shutdown_timeout, then cancel and release
them; write the outcomes still queued; release any lease left; leave the registry."""

from __future__ import annotations

import asyncio
import time

from ..core import Core
from ..logs import brief
from .leases import Leases
from .outcomes import Outcomes
from .report import log
from .state import WorkerState


def hurry(state: WorkerState) -> None:
    """Shutting down: stop waiting for running jobs; cancel and release them now."""
    for jid, r in state.running.items():
        if state.stopping and not r.task.done():
            state.reasons.setdefault((jid, r.claimed.attempt), "shutdown")
            r.task.cancel()


async def drain(core: Core, state: WorkerState, outcomes: Outcomes, leases: Leases) -> None:
    """Stop claiming; give running jobs shutdown_timeout; then cancel and release them.

    Flushes outcomes itself (the flusher may already be gone if a side loop crashed) and
    finally releases any lease this worker holds without running the job."""
    state.stopping = True
    # held jobs never start now: released with the other leases left (release_all_orphans)
    state.held.clear()
    s = core.settings
    busy = sum(1 for r in state.running.values() if not r.task.done())
    if busy:  # WARNING: a wait the user sees (logs.py: visible by default)
        log.warning("shutting down: waiting up to %ss for %d running job(s)",
                    s.shutdown_timeout, busy)
    end = time.monotonic() + s.shutdown_timeout
    while True:
        live = [(jid, r) for jid, r in state.running.items() if not r.task.done()]
        now = time.monotonic()
        if not live or now >= end:
            break
        # If the heartbeat is gone (a side loop crashed), leases are not renewed while we
        # wait: stop a job before its lease could expire rather than at shutdown_timeout.
        for jid, r in live:
            if now > r.renewed_at + s.lease_ttl - s.margin:
                state.reasons.setdefault((jid, r.claimed.attempt), "shutdown")
                r.task.cancel()
        await asyncio.wait([r.task for _, r in live],
                           timeout=min(end - now, s.heartbeat_interval / 2))
    pending = []
    for jid, r in list(state.running.items()):
        if not r.task.done():
            state.reasons.setdefault((jid, r.claimed.attempt), "shutdown")
            r.task.cancel()
            pending.append(r.task)
    if pending:
        log.warning("shutting down: cancelled %d job(s) still running; they are released "
                    "to run again at once", len(pending))
        await asyncio.wait(pending, timeout=5.0)
    deadline = time.monotonic() + max(s.shutdown_timeout, 5.0)
    delay = 0.05
    while time.monotonic() < deadline:
        async with outcomes.lock:  # a write the flusher has in flight must land first
            pass
        if not outcomes.outbox:
            break
        if not await outcomes.flush():
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
    try:
        await leases.release_all_orphans()
    except Exception as exc:  # their leases expire and they are reclaimed
        log.warning("could not release leases at shutdown (%s)", brief(exc))


async def deregister(core: Core) -> None:
    """Leave the worker registry on a clean exit, so ``status`` lists live workers only
    (a worker that dies stays there, its last heartbeat getting older)."""
    W, me = core.db.t.workers, core.settings.worker_id
    try:
        async with asyncio.timeout(5.0):
            await core.db.write(
                lambda conn: conn.execute(W.delete().where(W.c.id == me)), retries=2)
    except Exception as exc:  # best effort: the row only ages
        log.debug("could not deregister worker %s: %s", me, exc)

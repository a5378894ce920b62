"""One round of the tick loop: write the finished attempts (one fenced finalize) and lease
jobs for the free slots. How the two share the database is the dialect's choice, made once
at start (``DialectOps.round_kind``; the PostgreSQL two are in pg_rounds.py):

* ``SharedRound`` (SQLite): the database runs in this process, so no commit answer can be
  lost between the two: finalize and claim share one transaction and one commit. One
  writer at a time: nothing runs beside it, and only a few leases are taken ahead
  (prefetch: one per slot, SHARED_AHEAD at least, SHARED_AHEAD_GROUPS over many groups),
  so the next jobs run while a round commits.
* ``ParallelRound`` (MySQL/MariaDB): the claim runs beside the finalize on another
  connection when it cannot depend on it (a backlog, or jobs nothing waits on), else
  right after it, so a DAG's critical path takes one round per step. Never one
  transaction for both: a round whose commit answer is lost would strand the leases it
  took until they are released as orphans, bumping those jobs' attempt numbers.
* ``AutocommitRound`` (PostgreSQL): as ParallelRound, with the statements that are atomic
  on their own in autocommit (no BEGIN/COMMIT): successes of jobs nothing waits on in one
  fenced UPDATE, and a claim with no gate to take.
* ``RoutineRound`` (PostgreSQL with the one-call routine installed): every success is one
  call of the routine, which also releases and rolls up, and at a DAG step the same call
  leases the jobs it released (the claim rides along: one round trip less; a lost answer
  then costs what a lost claim's does).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from ..claimed import Claimed, Hold, LeaseAsk
from ..core import Core
from ..finalize import Outcome, Recount
from ..held import swaps
from ..logs import brief
from .outcomes import Outcomes
from .report import log
from .state import WorkerState

#: Prefetch aims to hold about this many seconds of work ahead of the free slots ...
PREFETCH_HORIZON = 0.05
#: ... and never more than this many times its capacity, or PREFETCH_FLOOR jobs if more: a
#: small worker running very short jobs would otherwise pay a round per handful of jobs.
PREFETCH_MAX = 2
PREFETCH_FLOOR = 64
#: ... or this many where the last census found more than one group with runnable jobs:
#: a claim over many groups reads each of them (the census's scan, a pick per group), so
#: fewer, larger claims (still within PREFETCH_HORIZON of work) cost less per job
PREFETCH_FLOOR_GROUPS = 192
#: SQLite (SharedRound): at most max(SHARED_AHEAD, capacity) leases ahead (and, as
#: everywhere, no more than PREFETCH_HORIZON seconds of work at the recent pace) ...
SHARED_AHEAD = 8
#: ... or max(SHARED_AHEAD_GROUPS, capacity) where the last census found more than one
#: group with runnable jobs: as PREFETCH_FLOOR_GROUPS, a claim over many groups pays a
#: census and a pick per group, and SQLite's one writer pays it with every process waiting
SHARED_AHEAD_GROUPS = 32
#: MySQL/MariaDB (ParallelRound) carry more per round: there a round is two transactions
#: of three statements or more (no UPDATE ... RETURNING, no autocommit path), so the same
#: total concurrency over 8 processes cost the server twice the statements per job of one
#: process. Their prefetch aims at WIDE_HORIZON seconds of work (at most WIDE_FLOOR jobs
#: where that is more than PREFETCH_MAX x capacity), and a busy worker's round may wait
#: WIDE_HOLD x pacing.ROUND_HOLD to carry more.
WIDE_HORIZON = 0.15
WIDE_FLOOR = 96
#: ... and at most WIDE_FLOOR_GROUPS where the last census found several groups: there
#: the census reads every ready entry of each group it returns (MariaDB has no loose index
#: scan) and entries of leased jobs that purge has not yet removed, so fewer, larger claims
#: pay it less often
WIDE_FLOOR_GROUPS = 384
WIDE_HOLD = 3.0
#: Under a counted cap, a worker holds jobs ahead (state ``leased``: see
#: Slots.take_over) per slot it holds: about PREFETCH_HORIZON seconds of work at its
#: recent pace, at least one and at most this many
HOLD_PER_SLOT = 8


class ParallelRound:
    """Finalize, and claim beside it or right after it (see the module docstring)."""

    #: a busy worker's round may wait to carry more (pacing.hold), for up to this many
    #: times pacing.ROUND_HOLD
    holds = True
    hold_scale = WIDE_HOLD
    #: prefetch: seconds of work to lease ahead, and the most jobs (see prefetch())
    horizon = WIDE_HORIZON
    floor = WIDE_FLOOR
    floor_groups = WIDE_FLOOR_GROUPS

    def __init__(self, core: Core, state: WorkerState, outcomes: Outcomes) -> None:
        self.core = core
        self.state = state
        self.outcomes = outcomes

    async def run(self, want: int, types: list[str], quick: bool) -> tuple[bool, list[Claimed]]:
        """One round: write the queued outcomes and lease up to ``want`` jobs of ``types``
        (the slots the outcomes freed were counted when their handlers returned).
        (False, got) if a write failed: the outcomes stay queued."""
        out = self.outcomes
        claiming: asyncio.Future[list[Claimed] | None] | None = None
        ask: LeaseAsk | None = None
        try:
            async with out.lock:
                batch = out.take()
                # Under a counted cap the finalize and the claim share one transaction, so
                # the claim takes over the slots the batch frees (beside it, it would find
                # them still held and the freed slots would wait for the next poll). A
                # RateLimit alone counts starts, which no finalize frees: the claim (under
                # the gate) runs beside the finalize as when uncapped.
                if (want or self.hold_ask() is not None) and batch and (
                        self.core.claimer.live.counts_slots):
                    return await self.capped(batch, want, types, quick)
                # With no backlog, a finalize that may release jobs (a dependent, a
                # container's next child) goes first, so this round's claim already sees
                # them: a DAG's critical path takes one round per step, not two.
                if want and (self.state.backlog or all(
                        self.state.alone(o.job_id, o.attempt) for o in batch)):
                    claiming = asyncio.ensure_future(self.claim(want, types, quick))
                if want and batch and claiming is None:
                    ask = self.ask(want, types, quick)
                wrote = not batch or await out.write(batch, partial(self.finalize, batch, ask))
            if ask is not None and ask.rows:
                return wrote, ask.claimed
            if want and claiming is None:
                claiming = asyncio.ensure_future(self.claim(want, types, quick))
        except asyncio.CancelledError:
            if claiming is not None:  # its leases reach the buffer, for the drain to release
                with contextlib.suppress(Exception):
                    await claiming
            raise
        got = await claiming if claiming is not None else []
        return wrote and got is not None, got or []

    def ask(self, want: int, types: list[str], quick: bool) -> LeaseAsk | None:
        """A claim for the finalize to make too (see RoutineRound); none here."""
        return None

    def hold_ask(self, batch: list[Outcome] | None = None) -> Hold | None:
        """What this round's hand-over may hold ahead (Slots.take_over), or None: only
        under a counted cap with no RateLimit or local limit (a held job starts without
        asking them), for the one group a census last found alone, and while this worker
        renews its leases. Per slot of that group this worker holds once ``batch`` is
        written (its attempts of that group whose outcome is not in it: running, or ended
        with the outcome still to write) and per slot the round leases: what it runs in
        PREFETCH_HORIZON at its recent pace, one at least, HOLD_PER_SLOT at most."""
        core, state = self.core, self.state
        s, claimer = core.settings, core.claimer
        live = claimer.live
        g = claimer.single_group
        if (g is None or not live.counts_slots or live.rated or s.local_limits
                or state.stopping or live.cap(g) == 0 or live.generation != claimer.slots.checked
                or time.monotonic() - state.beat_ok_at >= s.lease_ttl - s.margin):
            return None
        have = state.held_count()
        pace = PREFETCH_HORIZON / max(state.avg_run or PREFETCH_HORIZON, 1e-6)
        per_slot = min(HOLD_PER_SLOT, max(1, int(pace)))
        # one per slot of its share where other processes serve these types (aiojobqueue.share)
        limit = per_slot * s.capacity if state.share is None else state.share
        if have >= limit:
            return None
        ending = {(o.job_id, o.attempt) for o in batch or ()}
        slots = sum(1 for r in state.running.values()
                    if r.claimed.group == g and (r.claimed.id, r.claimed.attempt) not in ending)
        return Hold(limit, slots, have, per_slot)

    def keep(self, got: list[Claimed], t0: float) -> None:
        """The jobs a hand-over leased into ``leased`` join the held ones."""
        for c in got:
            self.state.held.setdefault(c.group, deque()).append((c, t0))

    def prefetch(self, avg_run: float | None) -> int:
        """Extra jobs to lease ahead of free slots: about what this worker starts within
        ``horizon`` seconds at its recent pace, at most PREFETCH_MAX x ``capacity`` (or
        ``floor``); only while the last claim came back full (a backlog to run
        through: a shallow ready set is left to the other workers). None where a global
        cap, group cap or local limit is counted (a prefetched job would hold a scarce slot
        idle); under a RateLimit, at most a quarter of the starts its last count left
        (RateLimit.headroom: none near the limit, where a start leased ahead would be a
        scarce start held idle in this worker's buffer)."""
        s, live = self.core.settings, self.core.claimer.live
        if live.counts_slots or s.local_limits or avg_run is None or not self.state.backlog:
            return 0
        pace = s.capacity * self.horizon / max(avg_run, 1e-6)
        floor = (self.floor if self.core.claimer.single_group
                 else max(self.floor, self.floor_groups))
        ahead = min(max(PREFETCH_MAX * s.capacity, floor), int(pace))
        for limit in live.db_limits:
            ahead = min(ahead, limit.headroom // 4)
        return ahead

    def claim_runner(self) -> Callable[[Callable[[Any], Awaitable[list[Claimed]]]],
                                       Awaitable[list[Claimed]]]:
        """How a claim's transaction runs."""
        return self.core.db.write

    async def claim(self, want: int, types: list[str], quick: bool) -> list[Claimed] | None:
        """Lease up to ``want`` jobs into the buffer; None if the claim failed (back off)."""
        core, state = self.core, self.state
        claimer = core.claimer
        # The last claim found the global cap full: count without any lock first (a claim
        # that can lease nothing must not queue for the gate, or for SQLite's write lock,
        # ahead of the worker whose finalize is freeing a slot).
        if claimer.slots.cap_looks_full():
            try:
                if await core.db.read(claimer.slots.cap_is_full):
                    return []
            except Exception as exc:
                if not core.db.is_outage(exc):
                    raise
                return None
        t0 = time.monotonic()
        state.claiming = True
        # Shielded: a shutdown that lands mid-claim lets it finish, so its leases are not
        # lost (the drain releases what it claimed and did not start).
        write = asyncio.ensure_future(self.claim_runner()(
            lambda conn: core.claimer.claim(conn, want, types, quick)))
        try:
            try:
                got = await asyncio.shield(write)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    state.buffer.extend((c, t0) for c in await write)
                raise
            finally:
                state.claiming = False
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not core.db.is_outage(exc):
                raise
            log.warning("claim failed (%s); backing off", brief(exc),
                        extra={"worker": core.settings.worker_id})
            return None
        state.buffer.extend((c, t0) for c in got)
        return got

    def fast(self, batch: list[Outcome]) -> list[Outcome]:
        """Successes without a result of jobs nothing waits on (finalize.finish_fast)."""
        alone = self.state.alone
        return [o for o in batch if o.kind == "done" and o.result is None
                and alone(o.job_id, o.attempt)]

    def counts(self, batch: list[Outcome]) -> bool:
        """Whether ``batch`` may be written by finish_counted: the database returns no rows
        from an UPDATE (MySQL, MariaDB) and every outcome is a success (with or without a
        result) of a job leased with no parent and no dependents."""
        fin, alone = self.core.finalizer, self.state.alone
        return (bool(batch) and not fin.settler.path.returns_rows
                and all(o.kind == "done" and alone(o.job_id, o.attempt) for o in batch))

    async def finalize(self, batch: list[Outcome], ask: LeaseAsk | None = None) -> list[Outcome]:
        """Write ``batch`` in one transaction; returns the outcomes that took effect. Not
        retried (retries=0: a retry would hide a commit whose answer was lost); a failure
        leaves the whole batch to be written again, and outcomes that did commit are then
        recognised as such (see outcomes.py). Successes of independent jobs on MySQL/MariaDB:
        one counted UPDATE (finish_counted), or, where it falls short, rolled back and
        written again."""
        fin, db = self.core.finalizer, self.core.db
        started = swaps(batch)  # held jobs started in the batch's slots: running first

        async def counted(conn: Any) -> None:
            await fin.swap_in(conn, started, batch)
            await fin.finish_counted(conn, batch)

        async def detailed(conn: Any) -> list[Outcome]:
            await fin.swap_in(conn, started, batch)
            return await fin.finish_detailed(conn, batch)

        if self.counts(batch):
            with contextlib.suppress(Recount):
                await db.write(counted, retries=0)
                return list(batch)
        return await db.write(detailed, retries=0)

    async def capped(self, batch: list[Outcome], want: int, types: list[str],
                     quick: bool) -> tuple[bool, list[Claimed]]:
        """A round under a counted cap (outcomes to write, slots to fill): finalize and
        claim in one transaction (see _finalize_and_claim)."""
        leased: list[Claimed] = []
        wrote = await self.outcomes.write(batch, partial(
            self._finalize_and_claim, batch, want, types, quick, leased))
        return wrote, leased

    async def _finalize_and_claim(
        self, batch: list[Outcome], want: int, types: list[str], quick: bool,
        got: list[Claimed],
    ) -> list[Outcome]:
        """The round in one transaction: the claim sees the slots the finalize freed (and,
        under a cap, may take them over: Claimer.claim's ``freed``). The leased jobs go to
        the buffer (and ``got``) once it has committed. A lost commit answer costs what a
        lost claim's does (its leases are released as orphans)."""
        core, state = self.core, self.state
        t0 = time.monotonic()
        taken: list[Claimed] = []
        capped = core.claimer.live.needs_gate
        started = swaps(batch)
        hold: list[Hold | None] = [None]

        counted = [self.counts(batch)]

        async def both(conn: Any) -> list[Outcome]:
            # the held jobs started in the batch's slots are running before those slots'
            # jobs leave `running` (Finalizer.swap_in)
            await core.finalizer.swap_in(conn, started, batch)
            if counted[0]:  # one UPDATE for the whole finalize, or Recount (rolled back)
                await core.finalizer.finish_counted(conn, batch)
                applied = list(batch)
            else:
                applied = await core.finalizer.finish_detailed(conn, batch)
            # only a counted cap asks; uncapped rounds skip the per-job count
            freed = self._freed(applied, started) if capped else {}
            hold[0] = self.hold_ask(batch) if capped else None  # (afresh if run again)
            taken[:] = await core.claimer.claim(conn, want, types, quick, freed, hold[0])
            return applied

        state.claiming = True
        try:
            # Under a cap, a transaction that holds finished rows and then leases can meet
            # another worker's in a deadlock: the database refused it whole, so it runs
            # again (a failed round would leave the slots its batch holds idle for a
            # back-off). Uncapped (SQLite), as any finalize: not retried.
            write = (partial(core.db.write_refused_again, both) if capped
                     else partial(core.db.write, both, retries=0))
            try:
                applied = await write()
            except Recount:  # a row did not match: the general finalize, from the start
                counted[0] = False
                applied = await write()
        finally:
            state.claiming = False
        state.buffer.extend((c, t0) for c in taken)
        if hold[0] is not None:
            self.keep(hold[0].got, t0)
        got.extend(taken)
        return applied

    def _freed(self, applied: list[Outcome], started: list[tuple[int, int]]) -> dict[str, int]:
        """By group, the slots that the ``applied`` outcomes free (each took its job out of
        `running`) less those taken by the held jobs ``started`` in them (id, attempt)."""
        running = self.state.running
        freed: dict[str, int] = {}
        for o in applied:
            r = running.get(o.job_id)
            if r is not None and r.claimed.attempt == o.attempt:
                freed[r.claimed.group] = freed.get(r.claimed.group, 0) + 1
        for jid, _a in started:  # each took one of those slots
            r = running.get(jid)
            if r is not None and freed.get(r.claimed.group, 0) > 0:
                freed[r.claimed.group] -= 1
        return freed


class SharedRound(ParallelRound):
    """Finalize and claim in one transaction (see the module docstring)."""

    holds = False  # one writer at a time, and few leases ahead: nothing to carry more of
    horizon = PREFETCH_HORIZON
    floor = PREFETCH_FLOOR
    floor_groups = PREFETCH_FLOOR_GROUPS  # (then SHARED_AHEAD_GROUPS: see prefetch())

    async def run(self, want: int, types: list[str], quick: bool) -> tuple[bool, list[Claimed]]:
        out = self.outcomes
        claiming: asyncio.Future[list[Claimed] | None] | None = None
        try:
            async with out.lock:
                batch = out.take()
                if batch and (want or self.hold_ask() is not None):
                    leased: list[Claimed] = []
                    wrote = await out.write(batch, partial(
                        self._finalize_and_claim, batch, want, types, quick, leased))
                    return wrote, leased
                wrote = not batch or await out.write(batch, partial(self.finalize, batch, None))
            if want:
                claiming = asyncio.ensure_future(self.claim(want, types, quick))
        except asyncio.CancelledError:
            if claiming is not None:
                with contextlib.suppress(Exception):
                    await claiming
            raise
        got = await claiming if claiming is not None else []
        return wrote and got is not None, got or []

    def prefetch(self, avg_run: float | None) -> int:
        # One writer at a time: a worker that leases far ahead re-takes the write lock round
        # after round while other processes sit in the busy handler's back-off, so it would
        # end up hoarding the queue. A few leases (one per slot, SHARED_AHEAD at least) only
        # let the next jobs run while the round writing the last ones commits (a capacity=1
        # worker otherwise waits for each round between two jobs: bench/wake.py). Over
        # many groups a few more (SHARED_AHEAD_GROUPS): each claim's census and picks cost
        # about twice a one-group claim's, and fewer, larger claims keep the write lock
        # free for longer between them.
        cap = self.core.settings.capacity
        ahead = SHARED_AHEAD if self.core.claimer.single_group else SHARED_AHEAD_GROUPS
        return min(super().prefetch(avg_run), max(ahead, cap))

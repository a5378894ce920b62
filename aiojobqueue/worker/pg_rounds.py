"""The PostgreSQL rounds (see rounds.py's module docstring): ``AutocommitRound`` writes
what is atomic on its own in autocommit, and ``RoutineRound`` finalizes a batch of
successes by one call of the installed routine, its riding claim included."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from ..claimed import Claimed, LeaseAsk
from ..finalize import Outcome
from ..held import swaps
from .rounds import PREFETCH_FLOOR, PREFETCH_FLOOR_GROUPS, PREFETCH_HORIZON, ParallelRound


class AutocommitRound(ParallelRound):
    """ParallelRound with the atomic statements in autocommit (see the module docstring)."""

    # every success is one autocommit UPDATE and a claim one statement: the usual pace
    hold_scale = 1.0
    horizon = PREFETCH_HORIZON
    floor = PREFETCH_FLOOR
    floor_groups = PREFETCH_FLOOR_GROUPS

    def claim_runner(self) -> Callable[[Callable[[Any], Awaitable[list[Claimed]]]],
                                       Awaitable[list[Claimed]]]:
        # The claim is one pick-and-lease UPDATE per group where no gate is taken and no
        # limit counted: atomic by itself.
        live, db = self.core.claimer.live, self.core.db
        return db.autocommit if not live.needs_gate else db.write

    async def finalize(self, batch: list[Outcome], ask: LeaseAsk | None = None,
                       fast: list[Outcome] | None = None) -> list[Outcome]:
        """The fast successes in one statement (finish_fast: one round trip), the rest, and
        any of those it skipped, fenced and settled in one transaction. (``fast``: the
        batch's fast successes, where the caller has them.)"""
        if fast is None:
            fast = self.fast(batch)
        if not fast or swaps(batch):  # (held jobs to make running: one transaction)
            return await ParallelRound.finalize(self, batch)
        fin = self.core.finalizer
        took = await self.core.db.autocommit(lambda conn: fin.finish_fast(conn, fast))
        return await self._rest(batch, fast, took)

    async def _rest(self, batch: list[Outcome], tried: list[Outcome],
                    took: set[tuple[int, int]]) -> list[Outcome]:
        applied = [o for o in tried if (o.job_id, o.attempt) in took]
        rest = [o for o in batch if (o.job_id, o.attempt) not in took]
        if rest:
            applied += await super().finalize(rest)
        return applied


class RoutineRound(AutocommitRound):
    """Successes by one call of the routine, the claim riding along at a DAG step."""

    def ask(self, want: int, types: list[str], quick: bool) -> LeaseAsk | None:
        return self.core.claimer.lease_ask(want, types, quick)

    def _freeing(self, batch: list[Outcome]) -> dict[str, int] | None:
        """The batch's jobs by group, where every outcome is a success of a job this worker
        runs (what the routine may finish); else None."""
        freeing: dict[str, int] = {}
        for o in batch:
            r = self.state.running.get(o.job_id)
            if o.kind != "done" or r is None:
                return None
            freeing[r.claimed.group] = freeing.get(r.claimed.group, 0) + 1
        return freeing

    async def capped(self, batch: list[Outcome], want: int, types: list[str],
                     quick: bool) -> tuple[bool, list[Claimed]]:
        """Where every outcome is a success and the claimer may hand the freed slots over
        (Slots.hand_ask), one call of the routine finalizes them and leases their
        replacements (no more than it finished: no gate); else as ParallelRound."""
        core, claimer = self.core, self.core.claimer
        ask: LeaseAsk | None = None
        # Held jobs to make running, or to lease: the transaction of ParallelRound.capped
        # (the routine makes no row `leased` nor `running` from `leased`).
        freeing = None if swaps(batch) or self.hold_ask() is not None else self._freeing(batch)
        if freeing is not None:
            ask = claimer.slots.hand_ask(want, types, quick, freeing)
            if (ask is None and claimer.slots.handover_stale(time.monotonic(), quick)
                    and not claimer.live.rated and await self._quietly(
                        lambda conn: claimer.slots.still_one_group(conn, types))):
                # the hand-over's window ran out: one census statement renews it
                ask = claimer.slots.hand_ask(want, types, quick, freeing)
        if ask is None:
            return await super().capped(batch, want, types, quick)
        wrote = await self.outcomes.write(batch, partial(self.finalize, batch, ask))
        if ask.rows is None:  # the routine declined: the slots are free, claim them
            got = await self.claim(want, types, quick) if wrote else []
            return wrote and got is not None, got or []
        if len(ask.claimed) < len(batch) and want < len(batch):
            # slots this worker cannot fill: wake the others for them
            await self._quietly(core.db.ops.notify)
        return wrote, ask.claimed

    async def _quietly(self, fn: Callable[[Any], Awaitable[Any]]) -> Any:
        """``fn`` in autocommit; None where the database is away (the round goes on: the
        finalize's own write reports the outage)."""
        try:
            return await self.core.db.autocommit(fn)
        except Exception as exc:
            if not self.core.db.is_outage(exc):
                raise
            return None

    async def finalize(self, batch: list[Outcome], ask: LeaseAsk | None = None,
                       fast: list[Outcome] | None = None) -> list[Outcome]:
        """Where every success is fast, as AutocommitRound; else all successes by the
        routine (results to store, a parent or dependents: it does it all), with ``ask``
        riding along: the jobs it leased go to the buffer (and ``ask.claimed``) at once."""
        if fast is None:
            fast = self.fast(batch)
        if swaps(batch):  # held jobs to make running first: one transaction (ParallelRound)
            return await ParallelRound.finalize(self, batch)
        done = [o for o in batch if o.kind == "done"]
        if len(fast) == len(done) and (ask is None or not ask.hand):
            return await super().finalize(batch, None, fast)
        core, state = self.core, self.state
        fin = core.finalizer
        if ask is None:
            took = await core.db.autocommit(lambda conn: fin.finish_in_one_call(conn, done))
        else:  # (no claim round runs beside it: see ParallelRound.run)
            t0 = time.monotonic()
            state.claiming = True  # its leases are no orphans while it is in flight
            try:
                took = await core.db.autocommit(
                    lambda conn: fin.finish_in_one_call(conn, done, ask=ask))
            finally:
                state.claiming = False
            if ask.rows is not None:
                ask.claimed = core.claimer.asked_claims(ask)
                state.buffer.extend((c, t0) for c in ask.claimed)
        return await self._rest(batch, done, took)

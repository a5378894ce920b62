"""The global cap and the group caps in a claim: the count under the gate, and its two
speed-ups (docs/scheduling.md "Caps"). ``Slots`` is the part of a ``Claimer`` that counts.

* The count: a claim under a counted cap or rate takes the gate row, then counts what runs
  (``free_slots``); a claim that found the cap full looks without the gate first
  (``cap_looks_full``, ``cap_is_full``), so it never queues for the gate to lease nothing.
* The hand-over: in the transaction of a finalize, the slots it freed go to the one known
  group's next jobs, without the gate and without counting (``_handover``,
  ``handover_claim``; PostgreSQL's one-call finalize asks through ``hand_ask``). Leasing no
  more than was freed keeps every count at or below its value before the transaction.
* Held slots: with a hand-over, jobs leased ahead into ``leased`` (``take_over``), counted by
  no cap, started only in a slot of their group this worker holds (held.py).

After a change of the policy (live_policy.py) the hand-over is off until a count finds the
caps held (``checked``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .census import Census
from .claimed import Claimed, Hold, LeaseAsk, claimed_rows
from .lease import LeasePath
from .live_policy import caps_held
from .sql import lit

if TYPE_CHECKING:
    from .claim import Claimer

class Slots:
    """The counting part of a ``Claimer`` ``c`` (see the module docstring)."""

    def __init__(self, c: Claimer) -> None:
        self.c = c
        #: the policy generation whose caps a count found held: the hand-over (which
        #: keeps a count where it was) is off from a change until then (caps_held)
        self.checked = 0
        #: the last claim found the global concurrency cap full
        self.cap_full = False
        #: the claimer's picks, leasing into ``leased`` (held ahead: see take_over)
        self.hold_path: LeasePath = type(c.path)(c.db, c.settings, S.LEASED)

    def count_running(self) -> Any:
        """The statement counting every running job (what the global cap holds)."""
        J = self.c.db.t.jobs
        return self.c.db.stmt("claim.running", lambda: select(func.count()).select_from(J).where(
            J.c.state == lit(S.RUNNING)))

    def cap_looks_full(self) -> bool:
        """The last claim found the global cap full: look (``cap_is_full``, outside the
        claim's transaction) before queueing for the gate."""
        return self.c.live.concurrency is not None and self.cap_full

    async def cap_is_full(self, conn: AsyncConnection) -> bool:
        """Whether the global cap is full now, counted without the gate or any write lock
        (a claim that can lease nothing must not hold up the one whose finalize just freed
        a slot). Without the lock this only ever declines a claim, never grants one."""
        c = self.c.live.concurrency
        full = c is not None and (await conn.execute(self.count_running())).scalar_one() >= c
        self.cap_full = full
        return full

    async def free_slots(self, conn: AsyncConnection, want: int) -> int:
        """Take the gate (where a cap must be counted exactly), then how many of ``want``
        slots the global cap and the RateLimits leave free (0 or less: none)."""
        live, db = self.c.live, self.c.db
        count_running = self.count_running()
        if live.needs_gate:
            await db.ops.lock_gate(conn)
        free = want
        if live.concurrency is not None:
            running_all = (await conn.execute(count_running)).scalar_one()
            self.cap_full = running_all >= live.concurrency
            free = min(free, live.concurrency - running_all)
        for limit in live.db_limits:
            free = min(free, await limit.budget(conn, db.t))
        return free

    def hand_ask(self, want: int, types: list[str], quick: bool,
                 freeing: Mapping[str, int]) -> LeaseAsk | None:
        """Under a counted cap, the hand-over (see _handover) as a LeaseAsk for the call
        that finalizes ``freeing`` (the batch's jobs by group, all successes): that call
        leases no more than it finished, so, where the known group is capped, only when
        every one of them is of that group; else None. It promotes nothing: a due
        ``scheduled`` job waits for the first claim after the hand-over's window (the
        census's, LOOK_EVERY), which promotes before it counts."""
        live = self.c.live
        types = live.types(types)
        if want <= 0 or not types or not live.needs_gate:
            return None
        hand = self._handover(time.monotonic(), quick, freeing)
        if hand is None or (live.cap(hand[0]) is not None and len(freeing) > 1):
            return None
        return LeaseAsk(hand[0], types, min(want, hand[1]), hand=True)

    def handover_stale(self, now: float, quick: bool) -> bool:
        """A group was known to be the only one with runnable jobs, but that census is
        older than the hand-over trusts: LOOK_EVERY even where poll_interval is shorter
        (under a cap a round comes about once per job length, and a group that gets work
        meanwhile is still seen within LOOK_EVERY: the census runs at the first claim
        after it). still_one_group renews it."""
        trust = self.c.census_trusted()
        window = max(trust, self.c.settings.poll_interval) if quick else trust
        return self.c.single_group is not None and now - self.c.groups_at >= window

    def _handover(self, now: float, quick: bool, freed: Mapping[str, int] | None,
                  holding: bool = False) -> tuple[str, int] | None:
        """(group, at most how many) where this claim may take over the slots its own
        transaction's finalize freed (``freed``: jobs taken out of ``running`` by group)
        without the gate and without counting: one known group (no split to make, as in
        _known_group), no RateLimit (a start is spent whoever frees a slot). Leasing at
        most what was freed (and, for a capped group, at most what that group freed) in
        the same transaction leaves every count the caps hold at or below its value before
        the transaction, so no claim under the gate can be misled into exceeding a cap.
        ``holding``: only jobs to hold ahead are asked for (no slot is free here): (g, 0)
        where the rest applies, whatever was freed (a held job is counted by no cap)."""
        live = self.c.live
        if (freed is None or (not freed and not holding) or live.rated
                or live.generation != self.checked
                or self.c.single_group is None or self.handover_stale(now, quick)):
            return None
        g = self.c.single_group
        cap = live.cap(g)
        if cap == 0:
            return None  # paused: no hand-over keeps it running
        n = freed.get(g, 0) if cap is not None else sum(freed.values())
        return (g, n) if n > 0 or holding else None

    async def handover_claim(
        self, conn: AsyncConnection, now: float, want: int, types: list[str], quick: bool,
        freed: Mapping[str, int] | None, hold: Hold | None,
    ) -> list[Claimed] | None:
        """The claim as a hand-over (see _handover: under a cap, the slots this
        transaction's finalize freed, without the gate), where one applies and is all the
        claim does; else None: the claim goes on under the gate."""
        live = self.c.live
        # jobs to hold: a hand-over of no slot may lease them (see below)
        holding = hold is not None and hold.room(0) > 0
        asking = want > 0 or holding
        if (live.generation != self.checked and freed is not None and live.needs_gate
                and await caps_held(conn, self.c.db, live, freed, self.count_running())):
            self.checked = live.generation
        hand = self._handover(now, quick, freed, holding) if live.needs_gate and asking else None
        if (hand is None and freed is not None and (freed or holding) and live.needs_gate
                and asking and not live.rated
                and self.handover_stale(now, quick) and await self.still_one_group(conn, types)):
            hand = self._handover(now, quick, freed, holding)
        if hand is None:
            return None
        took = await self.take_over(conn, hand[0], min(want, hand[1]), types, freed, hold)
        # A hand-over that freed nothing only holds jobs. Where this worker has free
        # slots, the cap may have room the other workers freed: counted without the
        # gate first (a read: it can only make this claim decline), then the gate
        if hand[1] > 0 or want <= 0 or await self.cap_is_full(conn):
            return took
        return None

    async def still_one_group(self, conn: AsyncConnection, types: list[str]) -> bool:
        """The census, without the gate (it counts no cap): whether the one group known to
        have runnable jobs still is the only one (then it is trusted again from now, as
        after any census). Where the hand-over's window ran out, this is its one extra
        statement; where it finds other groups, the claim goes on under the gate."""
        census = Census(self.c, types)
        await census.fill(conn, 2)
        if not census.done or len(census.demand) != 1:
            return False
        self.c.single_group = next(iter(census.demand))
        self.c.groups_at, self.c.census_due = time.monotonic(), False
        return True

    async def take_over(self, conn: AsyncConnection, g: str, n: int, types: list[str],
                         freed: Mapping[str, int] | None, hold: Hold | None = None
                         ) -> list[Claimed]:
        """Lease up to ``n`` of ``g``'s best jobs into the slots this transaction freed
        (see _handover). A short pick leaves the census (and the gate, for any slot still
        free) to the next claim, at once; where this worker could not take every freed
        slot, the other workers are woken for the rest (delivered at commit).

        ``hold``: then lease up to ``hold.room(got)`` more of ``g``'s jobs as ``leased``
        (into ``hold.got``): held ahead, not started, counted by no cap. The worker starts
        one only in a slot of ``g`` it holds, when that slot's job ends, and the
        transaction that writes that job's outcome makes the held row ``running``
        (Finalizer.swap_in): what runs never exceeds this worker's rows in ``running``,
        which the caps count. Only where a hand-over applies (one known group, no
        RateLimit, not paused), so no other group is kept waiting by it beyond the
        hand-over's window: the worker gives them back when that stops holding."""
        out = await self.c.path.take(conn, g, n, types) if n > 0 else []
        got = len(out)
        if got < n:
            self.c.census_due = True
        if n > 0:  # (a hold alone frees nothing: the cap is as full as it was)
            self.cap_full = False
        if freed and sum(freed.values()) > got:
            await self.c.db.ops.notify(conn)
        if hold is not None and got == n:
            k = hold.room(got)
            if k > 0:
                hold.got += claimed_rows(await self.hold_path.take(conn, g, k, types))
        return claimed_rows(out)

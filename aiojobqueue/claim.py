"""The ranked, capped claim: one short transaction that leases up to N runnable jobs.

Inside it: promote due ``scheduled`` jobs, take the gate (where a global cap must be counted
exactly), count what runs per group, split the free slots by fair share, pick the best jobs
of each group (priority, then age) with SKIP LOCKED, and lease them; or, under a cap, in
the transaction of a finalize, hand the slots it freed over to the one known group's next
jobs (no gate, no count). ``Claimer`` owns what this process remembers between claims (when
it last promoted, the last census of groups, the groups known to exist). The caps' count,
the hand-over and held slots are ``slots.py``; the census is ``census.py``; how a pick
becomes a lease, and the pick statements, are ``lease.py`` (``LeasePath``, by whether the
dialect has ``UPDATE ... RETURNING``). Where the dialect has them (PostgreSQL), two
statements stand in for census and picks: the idle pick over many groups, and the fair pick
(census, split and picks in one) over few.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .census import Census, others_query
from .claimed import Claimed, Hold, LeaseAsk, claimed_rows
from .database import Database
from .lease import LeasePath, PickThenLease, ReturningLease, ready_among
from .live_policy import LivePolicy, spend_group_rates
from .policy import GroupDemand, fair_share, rotation_key
from .settings import Settings
from .slots import Slots
from .sql import lit
from .timeutil import db_now

#: A busy worker claims hundreds of times a second; what changes between its claims only
#: slowly it looks at again at most this often (capped by poll_interval): due retries and
#: snoozed jobs (the promotion sweep), and a census that found a single group with runnable
#: jobs (then two index probes renew it where no other group has ready jobs:
#: Claimer._still_alone). A due job or a new group waits at most this long.
LOOK_EVERY = 0.1
#: A fair pick (lease_stmts.fair_pick_stmt) reads this many groups more than the last complete
#: read found (or than it has slots to fill, if more): a few new groups keep it complete.
FAIR_SLACK = 8
#: ... and at least this many (plus FAIR_SLACK), or twice the slots it fills if more
FAIR_SCAN = 128


class Claimer:
    """This process's claims, and what it remembers between them."""

    def __init__(self, settings: Settings, db: Database) -> None:
        self.settings = settings
        self.db = db
        #: the stored policy as this process last read it: caps, weights, rates, pauses
        self.live = LivePolicy(settings)
        self.path: LeasePath = (ReturningLease if db.ops.returning else PickThenLease)(
            db, settings)
        self.promoted_at = 0.0  # monotonic time of this process's last promotion sweep
        self.groups_at = 0.0  # ... and of its last census of groups with runnable jobs
        self.census_due = False  # a claim left the census to the next one (see claim())
        self.single_group: str | None = None  # the only such group then, if just one
        #: the last group that ran nothing and was served: fair share's rotation (ties
        #: among equal ratios) goes on after it (see policy.fair_share, Census)
        self.cursor: str | None = None
        #: how many groups had ready jobs at the last census that read them all, or None
        self.few_groups: int | None = None
        #: whether idle_pick_stmt is likely to find all it needs (see claim())
        self.idle_fits = True
        #: the last claim leased nothing though a job it could run was ready: another
        #: claim's pick held its row (skip_locked_passes_unmatched); look again soon
        self.passed_over = False
        #: the caps' count and its hand-over and held slots (slots.py)
        self.slots = Slots(self)

    async def promote_due(self, conn: AsyncConnection) -> None:
        """``scheduled`` jobs whose time has come become ``ready``."""
        J = self.db.t.jobs
        await conn.execute(
            update(J).where(J.c.state == lit(S.SCHEDULED), J.c.run_after <= db_now())
            .values(state=S.READY)
        )

    def _promotion_due(self, now: float, quick: bool) -> bool:
        poll = self.settings.poll_interval
        every = poll if quick else min(LOOK_EVERY, poll)
        return now - self.promoted_at >= every

    @staticmethod
    def census_trusted() -> float:
        """How long a census that found one group alone is trusted: LOOK_EVERY (read at
        the call, so a test may set it)."""
        return LOOK_EVERY

    def _known_group(self, now: float, quick: bool) -> str | None:
        """The one group with runnable jobs, if a recent census found just one and fair
        share has nothing to split (no group caps): claims may skip the census for a moment.
        A new group is seen within LOOK_EVERY, or at once when the known one runs dry."""
        if self.single_group is None or self.live.per_group:
            return None
        poll = self.settings.poll_interval
        window = poll if quick else min(LOOK_EVERY, poll)
        return self.single_group if now - self.groups_at < window else None

    def lease_ask(self, want: int, types: list[str], quick: bool) -> LeaseAsk | None:
        """A LeaseAsk where claim() would do nothing but pick from its known group: no
        promotion due, no gate, no counted cap or limit; else None (claim normally)."""
        now = time.monotonic()
        live = self.live
        types = live.types(types)
        if (want <= 0 or not types or live.needs_gate or live.concurrency is not None
                or live.rated or self._promotion_due(now, quick)):
            return None
        group = self._known_group(now, quick)
        return None if group is None else LeaseAsk(group, types, want)

    def asked_claims(self, ask: LeaseAsk) -> list[Claimed]:
        """The jobs ``ask`` leased, as claim() would return them. A short pick leaves the
        census to the next claim (as claim() does); an empty one makes it due at once."""
        rows = ask.rows or []
        if not rows:
            self.groups_at = 0.0
        elif len(rows) < ask.n:
            self.census_due = True
        return claimed_rows(rows)

    async def claim(
        self, conn: AsyncConnection, want: int, types: list[str], quick: bool = False,
        freed: Mapping[str, int] | None = None, hold: Hold | None = None,
    ) -> list[Claimed]:
        """Lease up to ``want`` jobs of ``types`` on ``conn`` (inside a write transaction).

        ``quick``: an idle worker was just woken (a job was enqueued or released): go
        straight for it. The promotion sweep and the census then run at most once per
        ``poll_interval`` (a tick) instead of every LOOK_EVERY / LOOK_EVERY.
        ``freed``: the jobs (by group) that a finalize earlier in this same transaction
        took out of ``running``; under a cap their slots may be handed over (Slots._handover).
        ``hold``: with a hand-over, also lease jobs ahead into ``leased`` (Slots.take_over)."""
        now = time.monotonic()
        self.passed_over = False
        if self._promotion_due(now, quick):
            await self.promote_due(conn)
            self.promoted_at = now
        types = self.live.types(types)  # (none while the queue is paused)
        if not types:
            return []
        took = await self.slots.handover_claim(conn, now, want, types, quick, freed, hold)
        if took is not None:
            return took
        if want <= 0:
            return []  # (only held jobs were asked for, and no hand-over applies)
        free = await self.slots.free_slots(conn, want)
        if free <= 0:
            return []
        p = _Picks(types, now, free)
        # With one group only (seen recently, no group caps) fair share has nothing to
        # split: skip the per-group census for a moment (at the latest, the claim that
        # follows at once holds it when the known group runs dry).
        known = self._known_group(now, quick)
        if known is None and await self._still_alone(conn, now):
            known = self.single_group
        if known is None and not self.live.per_group:
            await self._pick_before_census(conn, p)
        await self._census_and_picks(conn, p, known)
        return await self._lease_picks(conn, p)

    async def _pick_before_census(self, conn: AsyncConnection, p: _Picks) -> None:
        """No group known to be alone and no group caps: where the dialect has them
        (PostgreSQL, a ReturningLease), the fair pick or the idle pick stands in for the
        census and the picks, in part or whole (what is left of ``p.free`` goes to the
        census after)."""
        path = self.path
        if not isinstance(path, ReturningLease):
            return
        few = self.few_groups
        if few is not None or not self.idle_fits:
            # Few groups (the last census or fair pick read them all), or too few after
            # the cursor for the idle pick: census, split and picks in one statement
            # (fair_pick_stmt); a short one leaves the rest to the census below
            before = len(p.taken)
            fair = await path.pick_fair(conn, p.free, p.types, self.cursor,
                                        max(few or 0, 2 * p.free, FAIR_SCAN) + FAIR_SLACK,
                                        p.taken)
            if fair is not None:
                got = len(p.taken) - before
                p.free -= got
                p.firsts = [r[4] for r in p.taken[before:]]
                p.tried.update(p.firsts)
                p.first_served = fair.idle
                if fair.seen is not None:
                    self.few_groups = fair.seen if fair.complete else None
                    if fair.complete:
                        self.groups_at, self.census_due = p.now, False
                        self.single_group = p.firsts[0] if fair.seen == 1 else None
                    else:  # many groups: the idle pick reads only as far as it needs
                        self.idle_fits = True
        elif p.free > 1:
            # Many groups (the last census did not read them all): first the groups that
            # run nothing, one job each, without a census (see idle_pick_stmt)
            p.firsts = await path.pick_idle(conn, p.free, p.types, self.cursor, p.taken)
            if p.firsts:
                p.free -= len(p.firsts)
                p.first_served = p.firsts
            # short: too many groups run something for the scan's window (or the names
            # ran out); the census says when it fits again
            self.idle_fits = p.firsts is not None and p.free == 0
        if p.free <= 0 and p.first_served:
            self.cursor = max(p.first_served, key=rotation_key(self.cursor))

    async def _census_and_picks(self, conn: AsyncConnection, p: _Picks,
                                known: str | None) -> None:
        """Fill what is left of ``p.free``: fair share over the known group (no census) or
        over the census's groups, the split picked group by group. Where the known group
        ran dry, once more with a census."""
        cached = known is not None
        for _census in range(2 if p.free > 0 else 0):
            census: Census | None = None
            if known is not None and cached:
                demand, idle = {known: GroupDemand(1)}, {known}
            else:
                census = await self._take_census(conn, p, known)
                demand, idle = census.demand, census.idle
            served: list[str] = p.first_served if _census == 0 else []
            await self._split_and_pick(conn, p, demand, census, idle, served)
            if served:
                self.cursor = max(served, key=rotation_key(self.cursor))
            if not cached or p.free <= 0:
                break
            if p.taken:
                # The known group ran short, not dry: hand these jobs over now (a DAG step
                # waits on them); the worker claims again at once, and that claim looks for
                # other groups if the known one is dry by then.
                self.census_due = True
                break
            cached = False  # the one known group ran dry: look for others now

    async def _take_census(self, conn: AsyncConnection, p: _Picks,
                           known: str | None) -> Census:
        """The census of groups with runnable jobs, as far as ``p.free`` needs (``known``:
        the group whose pick just came back empty); what it found is remembered."""
        census = Census(self, p.types)
        await census.fill(conn, p.free)
        if known is not None:
            # the known group's pick just came back empty in this transaction: not
            # picked again (ran_dry is what a second empty pick would lead to; on
            # InnoDB each pick also locks the ready rows of other types it reads
            # until the commit, which a claim of theirs beside this one skips)
            census.ran_dry(known)
            await census.fill(conn, p.free)
        demand = census.demand
        # idle_pick_stmt scans 2 x free + 8 groups after the cursor (it does not
        # wrap round): at most `busy` of them run jobs
        self.idle_fits = census.busy <= p.free and not census.ran_out
        self.groups_at, self.census_due = p.now, False
        # the groups with work: what the census found, and what was just leased
        # without it
        had = set(demand) | set(p.firsts or ())
        if len(had) == 1 and census.done:
            self.single_group = next(iter(had))
        elif had:
            self.single_group = None
        # else nothing is runnable now: the group known to be the only one stays
        # cached, so the next claim (say, after this worker's finalize released its
        # dependents) picks at once; if that group is dry then, the census runs
        # again as above
        return census

    async def _split_and_pick(self, conn: AsyncConnection, p: _Picks,
                              demand: dict[str, GroupDemand], census: Census | None,
                              idle: set[str], served: list[str]) -> None:
        """Split ``p.free`` by fair share over ``demand`` and pick each group's share; the
        groups in ``idle`` (they ran nothing) that got a job join ``served``."""
        path = self.path
        # Work-conserving: a group with fewer runnable jobs than its share hands the
        # rest on (to groups read further on where needed).
        while p.free > 0 and demand:
            plan = fair_share(p.free, demand, rotate=True, after=self.cursor)
            exhausted = []
            asks = {g: n for g, n in sorted(plan.items()) if n > 0}
            if not asks:  # every group capped out
                break
            p.tried.update(asks)
            if len(asks) == 1:
                (g1, n1), = asks.items()
                gots = {g1: await path.pick(conn, g1, n1, p.types, p.taken)}
            else:  # many groups: one statement, not one round trip per group
                gots = await path.pick_many(conn, asks, p.types, p.taken)
            for g, n in asks.items():
                got = gots.get(g, 0)
                p.free -= got
                d = demand[g]
                if got and g in idle:
                    served.append(g)
                if got < n:
                    exhausted.append(g)
                else:
                    demand[g] = GroupDemand(d.weight, d.running + got,
                                            None if d.cap is None else d.cap - got)
            if not exhausted:
                break
            for g in exhausted:
                if census is None:
                    demand.pop(g)
                else:
                    census.ran_dry(g)
            if census is not None and p.free > 0:
                await census.fill(conn, p.free)  # (into demand: the same dict)

    async def _lease_picks(self, conn: AsyncConnection, p: _Picks) -> list[Claimed]:
        """Lease what the picks took (where the pick did not already), and spend the
        RateLimits' budgets on it. Where nothing was leased, note whether a ready job of
        a group tried was passed over (held by another claim's pick: passed_over)."""
        live, db = self.live, self.db
        out = await self.path.leased(conn, p.taken)
        if not out:
            if p.tried and db.ops.skip_locked_passes_unmatched:
                self.passed_over = await ready_among(db, conn, sorted(p.tried), p.types)
            return []
        for limit in live.db_limits:
            await limit.consume(conn, db.t, len(out))
        got = claimed_rows(out)
        if live.group_rates:
            await spend_group_rates(conn, db, live, (c.group for c in got))
        return got

    async def _still_alone(self, conn: AsyncConnection, now: float) -> bool:
        """Where a census found one group with runnable jobs and its window ran out: whether
        no other group has ready jobs now (census.others_query: two index probes, in place of
        a census that, on MariaDB, reads the whole backlog of that group). Then the group is
        trusted for another window, as if a census had found it alone again (no weights or
        counts to read: fair share gives the only group every slot). Where another group
        has ready jobs the census reads them all, as before."""
        g = self.single_group
        if g is None or self.live.per_group:
            return False
        db = self.db
        stmt = db.stmt("claim.others", lambda: others_query(db.t, db.ops))
        before, after = (await conn.execute(stmt, {"g": g})).one()
        if before is not None or after is not None:
            return False
        self.groups_at = now
        return True


@dataclass
class _Picks:
    """One claim's picks so far, shared by the steps of Claimer.claim."""

    types: list[str]
    now: float  # monotonic time the claim began
    free: int  # slots still to fill
    #: the rows picked (leased by the pick, or by _lease_picks at the end)
    taken: list[Any] = field(default_factory=list)
    tried: set[str] = field(default_factory=set)  # the groups picked from
    #: the groups leased from before the census (the fair pick or the idle pick)
    firsts: list[str] | None = None
    #: the groups that ran nothing and were served before the census: the cursor moves
    #: past them once the claim is done (its split's ties all go by the rotation after
    #: the cursor it began with, as fair_share's over every group)
    first_served: list[str] = field(default_factory=list)

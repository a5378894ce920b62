"""The ranked, capped claim: one short transaction that leases up to N runnable jobs.

Inside it: promote due ``scheduled`` jobs, take the gate (where a global cap must be counted
exactly), count what runs per group, split the free slots by fair share, pick the best jobs
of each group (priority, then age) with SKIP LOCKED, and lease them. ``Claimer`` owns what
this process remembers between claims (when it last promoted, the last census of groups,
the groups known to exist); how a pick becomes a lease is the dialect's ``LeasePath``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Select, bindparam, func, literal_column, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .database import Database
from .policy import GroupDemand, fair_share
from .settings import Settings
from .sql import lit
from .timeutil import db_now, utcnow_plus


@dataclass(frozen=True)
class Claimed:
    """A leased attempt: what the executor needs to run it and the fence to finish it."""

    id: int
    type: str
    args: dict[str, Any]
    attempt: int
    group: str
    timeout: float | None
    checkpoint: Any
    parent_id: int | None
    #: An edge pointed at this job when it was leased (the flag is never cleared): its
    #: finalize must release dependents, so it skips the one-statement path.
    has_dependents: bool = False
    #: The W3C trace context stored with the job (aiojobqueue.tracing), usually None.
    trace: Any = None


#: At most one promotion sweep per this many seconds per worker (capped by poll_interval):
#: a busy worker claims hundreds of times a second, but a due retry can wait a tick.
PROMOTE_EVERY = 0.1
#: How long a census that found a single group with runnable jobs is trusted.
GROUPS_EVERY = 0.1


def group_demand_query(t: S.Tables, types: list[str]) -> Select[Any]:
    """Groups with runnable work: (group, weight, running). One row per known group, each
    answered by index probes (a ready row exists; max weight; running count), so its cost
    follows the number of groups, never the depth of a backlog."""
    J, G = t.jobs, t.groups
    # Correlated LIMIT 1 probes, not EXISTS / MAX(): MariaDB turns EXISTS into a materialized
    # semi-join over every ready row and scans a whole group's index range for MAX(), so a
    # deep backlog would cost O(backlog) per claim. "First row of an index range" is O(1)
    # on every dialect (ix_ready, ix_ready_weight).
    has_ready = (
        select(J.c.id)
        .where(J.c.state == lit(S.READY), J.c.group_key == G.c.group_key, J.c.type.in_(types))
        .order_by(J.c.priority.desc(), J.c.id)  # ix_ready's order: the planner must use it
        .limit(1)
        .scalar_subquery()
    )
    # Only the heavier-than-default jobs are in ix_ready_weight (v4): none found means 1.
    # The bound is a literal, as in the index's predicate, so a generic plan can use it.
    weight = (
        select(J.c.weight)
        .where(J.c.state == lit(S.READY), J.c.group_key == G.c.group_key,
               J.c.weight > literal_column("1"))
        .order_by(J.c.weight.desc())
        .limit(1)
        .scalar_subquery()
    )
    running = (
        select(func.count()).select_from(J)
        .where(J.c.state == lit(S.RUNNING), J.c.group_key == G.c.group_key)
        .scalar_subquery()
    )
    return select(G.c.group_key, weight, running).where(has_ready.is_not(None))


def lease_values(t: S.Tables, ttl: Any, owner: Any) -> dict[str, Any]:
    """The SET clauses of a lease to ``owner`` for ``ttl`` seconds (values, or the one-call
    routine's variables' expressions)."""
    J = t.jobs
    return {
        "state": S.RUNNING,
        "lease_owner": owner,
        "lease_expires": utcnow_plus(ttl),
        "attempts": J.c.attempts + 1,
        "started_at": db_now(),
        "cancel_requested": False,
    }


def claim_columns(t: S.Tables) -> tuple[Any, ...]:
    """What a lease returns, in the order Claimed is built from (see claimed_rows)."""
    J = t.jobs
    return (J.c.id, J.c.type, J.c.args, J.c.attempts, J.c.group_key, J.c.timeout,
            J.c.checkpoint, J.c.parent_id, J.c.priority, J.c.has_dependents, J.c.trace)


def pick_and_lease_stmt(db: Database, group: Any, n: Any, of_types: Any,
                        lease: dict[str, Any]) -> Any:
    """UPDATE ... WHERE id IN (the best ``n`` ready jobs of ``group`` whose type matches
    ``of_types``, SKIP LOCKED) SET ``lease`` RETURNING claim_columns()."""
    J = db.t.jobs
    pick = db.ops.skip_locked(
        select(J.c.id)
        .where(J.c.state == lit(S.READY), J.c.group_key == group, of_types(J.c.type))
        .order_by(J.c.priority.desc(), J.c.id)
        .limit(n)
    )
    # in_select: on PostgreSQL the pick is an InitPlan feeding a primary-key probe, whatever
    # the planner settings (the one-call routine runs with nested loops off)
    return update(J).where(db.ops.in_select(J.c.id, pick)).values(**lease).returning(
        *claim_columns(db.t))


class ReturningLease:
    """A group's pick and its lease in one statement, the rows back in the same round trip
    (UPDATE ... RETURNING)."""

    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.lease = lease_values(db.t, settings.lease_ttl, settings.worker_id)

    async def pick(self, conn: AsyncConnection, g: str, n: int, types: list[str],
                   taken: list[Any]) -> int:
        """Lease up to ``n`` of ``g``'s best ready jobs; their rows join ``taken``."""
        key = ("pick", tuple(types))
        stmt = self.db.stmts.get(key)
        if stmt is None:  # built once per handler-type set
            stmt = self.db.stmts[key] = pick_and_lease_stmt(
                self.db, bindparam("g"), bindparam("n"), lambda col: col.in_(types), self.lease)
        rows = (await conn.execute(stmt, {"g": g, "n": n})).all()
        taken += rows
        return len(rows)

    async def leased(self, conn: AsyncConnection, taken: list[Any]) -> list[Any]:
        """The leased rows (claim_columns()) once every group was picked."""
        return taken


class PickThenLease:
    """Without UPDATE ... RETURNING: each group's pick locks ids (SKIP LOCKED); one UPDATE
    leases them all at the end and one SELECT reads their rows back."""

    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.lease = lease_values(db.t, settings.lease_ttl, settings.worker_id)

    async def pick(self, conn: AsyncConnection, g: str, n: int, types: list[str],
                   taken: list[Any]) -> int:
        J = self.db.t.jobs
        cond = [J.c.state == lit(S.READY), J.c.group_key == g, J.c.type.in_(types)]
        if taken:
            cond.append(J.c.id.not_in(taken))
        pick = self.db.ops.skip_locked(
            select(J.c.id).where(*cond).order_by(J.c.priority.desc(), J.c.id).limit(n))
        picked = [r[0] for r in await conn.execute(pick)]
        taken += picked
        return len(picked)

    async def leased(self, conn: AsyncConnection, taken: list[Any]) -> list[Any]:
        if not taken:
            return []
        J, ops = self.db.t.jobs, self.db.ops
        ids = sorted(taken)
        await conn.execute(update(J).where(ops.in_ids(J.c.id, ids)).values(**self.lease))
        return list((await conn.execute(
            select(*claim_columns(self.db.t)).where(ops.in_ids(J.c.id, ids)))).all())


LeasePath = ReturningLease | PickThenLease


@dataclass
class LeaseAsk:
    """A claim that rides along with a finalize (PostgreSQL's one-call routine, see
    finalize.finish_in_one_call): after the finalize has released what it releases, the
    same call leases up to ``n`` ready jobs of ``group`` and ``types``: the claim() of the
    known single group, without its round trip. ``rows``: what it leased, as
    claim_columns(); None while not done (the routine declined, or was not called)."""

    group: str
    types: list[str]
    n: int
    rows: list[Any] | None = None
    #: the rows as claim() returns them (see Claimer.asked_claims)
    claimed: list[Claimed] = field(default_factory=list)


def claimed_rows(rows: list[Any]) -> list[Claimed]:
    """Leased rows (claim_columns()) in pick order (RETURNING rows come back unordered: a
    prefetched job starts after the better ones claimed with it). By position: a Row's
    attribute look-up costs more, and this runs for every job."""
    rows = sorted(rows, key=lambda r: (-r[8], r[0]))
    return [Claimed(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], bool(r[9]), r[10])
            for r in rows]


class Claimer:
    """This process's claims, and what it remembers between them."""

    def __init__(self, settings: Settings, db: Database) -> None:
        self.settings = settings
        self.db = db
        self.path: LeasePath = db.ops.lease_path(db, settings)
        self.promoted_at = 0.0  # monotonic time of this process's last promotion sweep
        self.groups_at = 0.0  # ... and of its last census of groups with runnable jobs
        self.census_due = False  # a claim left the census to the next one (see claim())
        self.single_group: str | None = None  # the only such group then, if just one
        #: groups known to have their row (inserts skip the look-up for them)
        self.known_groups: set[str] = set()

    async def ensure_groups(self, conn: AsyncConnection, groups: list[str]) -> None:
        """Give every group in ``groups`` its row (inside the caller's insert)."""
        new = [g for g in groups if g not in self.known_groups]
        if not new:
            return
        G = self.db.t.groups
        stmt = select(G.c.group_key).where(G.c.group_key.in_(new))
        have = {r[0] for r in await conn.execute(stmt)}
        missing = [{"group_key": g} for g in new if g not in have]
        if missing:
            await self.db.ops.insert_ignore(conn, G, missing)
        # Cache only rows seen committed: this transaction may still roll back.
        self.known_groups.update(have)

    async def promote_due(self, conn: AsyncConnection) -> None:
        """``scheduled`` jobs whose time has come become ``ready``."""
        J = self.db.t.jobs
        await conn.execute(
            update(J).where(J.c.state == lit(S.SCHEDULED), J.c.run_after <= db_now())
            .values(state=S.READY)
        )

    def _promotion_due(self, now: float, quick: bool) -> bool:
        poll = self.settings.poll_interval
        every = poll if quick else min(PROMOTE_EVERY, poll)
        return now - self.promoted_at >= every

    def _known_group(self, now: float, quick: bool) -> str | None:
        """The one group with runnable jobs, if a recent census found just one and fair
        share has nothing to split (no group caps): claims may skip the census for a moment.
        A new group is seen within GROUPS_EVERY, or at once when the known one runs dry."""
        if self.single_group is None or self.settings.group_limits:
            return None
        poll = self.settings.poll_interval
        window = poll if quick else min(GROUPS_EVERY, poll)
        return self.single_group if now - self.groups_at < window else None

    async def _demand(self, conn: AsyncConnection, types: list[str]) -> dict[str, GroupDemand]:
        """Groups with runnable jobs of ``types``: their weight, what they run, their room."""
        rows = (await conn.execute(group_demand_query(self.db.t, types))).all()
        caps = self.settings.group_limits
        demand: dict[str, GroupDemand] = {}
        for g, w, r in rows:
            cap = caps.get(g)
            demand[g] = GroupDemand(int(w or 1), int(r),
                                    None if cap is None else max(cap - int(r), 0))
        return demand

    def lease_ask(self, want: int, types: list[str], quick: bool) -> LeaseAsk | None:
        """A LeaseAsk where claim() would do nothing but pick from its known group: no
        promotion due, no gate, no counted cap or limit; else None (claim normally)."""
        now = time.monotonic()
        s = self.settings
        if (want <= 0 or not types or s.needs_gate or s.concurrency is not None
                or s.db_limits or self._promotion_due(now, quick)):
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
        self, conn: AsyncConnection, want: int, types: list[str], quick: bool = False
    ) -> list[Claimed]:
        """Lease up to ``want`` jobs of ``types`` on ``conn`` (inside a write transaction).

        ``quick``: an idle worker was just woken (a job was enqueued or released): go
        straight for it. The promotion sweep and the census then run at most once per
        ``poll_interval`` (a tick) instead of every PROMOTE_EVERY / GROUPS_EVERY."""
        s, db = self.settings, self.db
        J = db.t.jobs
        now = time.monotonic()
        if self._promotion_due(now, quick):
            await self.promote_due(conn)
            self.promoted_at = now
        if s.needs_gate:
            await db.ops.lock_gate(conn)
        free = want
        if s.concurrency is not None:
            running_all = (await conn.execute(
                select(func.count()).select_from(J).where(J.c.state == lit(S.RUNNING))
            )).scalar_one()
            free = min(free, s.concurrency - running_all)
        for limit in s.db_limits:
            free = min(free, await limit.budget(conn, db.t))
        if free <= 0:
            return []
        path = self.path
        taken: list[Any] = []
        # With one group only (seen recently, no group caps) fair share has nothing to
        # split: skip the per-group census for a moment (at the latest, the claim that
        # follows at once holds it when the known group runs dry).
        known = self._known_group(now, quick)
        cached = known is not None
        for _census in range(2):
            if known is not None and cached:
                demand = {known: GroupDemand(1)}
            else:
                demand = await self._demand(conn, types)
                self.groups_at, self.census_due = now, False
                if len(demand) == 1:
                    self.single_group = next(iter(demand))
                elif demand:
                    self.single_group = None
                # else nothing is runnable now: the group known to be the only one stays
                # cached, so the next claim (say, after this worker's finalize released its
                # dependents) picks at once; if that group is dry then, the census runs
                # again as above
            # Work-conserving: a group with fewer runnable jobs than its share hands the
            # rest on.
            for _ in range(len(demand) + 1):
                if free <= 0 or not demand:
                    break
                plan = fair_share(free, demand)
                exhausted = []
                for g, n in sorted(plan.items()):
                    if n <= 0:
                        continue
                    got = await path.pick(conn, g, n, types, taken)
                    free -= got
                    d = demand[g]
                    if got < n:
                        exhausted.append(g)
                    else:
                        demand[g] = GroupDemand(d.weight, d.running + got,
                                                None if d.cap is None else d.cap - got)
                for g in exhausted:
                    demand.pop(g)
                if not exhausted:
                    break
            if not cached or free <= 0:
                break
            if taken:
                # The known group ran short, not dry: hand these jobs over now (a DAG step
                # waits on them); the worker claims again at once, and that claim looks for
                # other groups if the known one is dry by then.
                self.census_due = True
                break
            cached = False  # the one known group ran dry: look for others now
        out = await path.leased(conn, taken)
        if not out:
            return []
        for limit in s.db_limits:
            await limit.consume(conn, db.t, len(out))
        return claimed_rows(out)

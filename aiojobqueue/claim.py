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

from sqlalchemy import (
    Integer,
    Select,
    String,
    bindparam,
    func,
    literal_column,
    select,
    union_all,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .database import Database
from .policy import GroupDemand, fair_share, rotation_key
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


#: Up to this many groups with ready jobs, a census reads them all in one statement.
WHOLE = 64
#: The name of the census's recursive CTE (what a statement log shows a census by).
CENSUS_CTE = "census_scan"


def scan_cte(t: S.Tables, ops: Any, from_start: bool, name: str) -> Any:
    """The loose index scan of ix_ready: (g, n) for the next ``:lim`` groups with ready
    jobs in name order after ``:after`` (from the first unless ``from_start``), n = 1, 2, ...
    (a last row has g NULL where the names ran out)."""
    J = t.jobs
    native = ops.group_scan(J.c.state, lit(S.READY), J.c.group_key, from_start)
    if native is not None:
        return native.subquery(name)
    inner = J.alias("nx")
    first = select(J.c.group_key).where(J.c.state == lit(S.READY))
    if not from_start:
        first = first.where(ops.key_after(J.c.state, lit(S.READY), J.c.group_key,
                                          bindparam("after", type_=String())))
    anchor = select(first.order_by(J.c.group_key).limit(1).scalar_subquery().label("g"),
                    literal_column("1").label("n"))
    scan = anchor.cte(name, recursive=True)
    step = select(
        select(inner.c.group_key)
        .where(inner.c.state == lit(S.READY),
               ops.key_after(inner.c.state, lit(S.READY), inner.c.group_key, scan.c.g))
        .order_by(inner.c.group_key)
        .limit(1)
        .scalar_subquery(),
        scan.c.n + literal_column("1"),
    ).where(scan.c.g.is_not(None), scan.c.n < bindparam("lim", type_=Integer()))
    return scan.union_all(step)


def idle_pick_stmt(db: Database, types: list[str], from_start: bool,
                   lease: dict[str, Any]) -> Any:
    """Where the dialect can (DialectOps.pick_each), one statement that leases the best
    job of each of the first ``:free`` groups in rotation order that run nothing (scanning
    at most ``:lim`` groups after ``:after``), RETURNING claim_columns(); else None.

    While at least ``free`` groups with work run nothing, that is fair_share's whole split
    (each of them has ratio 0 and is served once, in rotation order, before any other
    group gets a slot), so a claim over many groups needs no census; where it comes back
    short (the names ran out, a group had no job of ``types``) the census splits the rest."""
    J = db.t.jobs
    scan = scan_cte(db.t, db.ops, from_start, "idle_scan")
    R = J.alias("rn")
    busy = select(R.c.id).where(R.c.state == lit(S.RUNNING), R.c.group_key == scan.c.g).exists()
    keys = (select(scan.c.g).where(scan.c.g.is_not(None), ~busy).order_by(scan.c.n)
            .limit(bindparam("free", type_=Integer())).subquery("k"))

    def pick(group: Any) -> Select[Any]:
        return (select(J.c.id)
                .where(J.c.state == lit(S.READY), J.c.group_key == group, J.c.type.in_(types))
                .order_by(J.c.priority.desc(), J.c.id)
                .limit(1))

    sel = db.ops.pick_each(keys, pick)
    if sel is None:
        return None
    return update(J).where(db.ops.in_select(J.c.id, sel)).values(**lease).returning(
        *claim_columns(db.t))


def census_query(t: S.Tables, ops: Any, from_start: bool, with_running: bool
                 ) -> Select[Any]:
    """Rows (group, n, weight, running) for the next ``:lim`` groups with ready jobs in name
    order, after ``:after`` unless ``from_start`` (n: 1, 2, ...), plus, with
    ``with_running``, every group that runs a job (n = 0).

    The groups with ready jobs are found by a loose index scan of ix_ready (a recursive CTE,
    one "next group_key after this one" probe per group), so the cost follows the groups
    read, never the groups that once had jobs nor the depth of a backlog; the running ones
    come from ix_running (at most what the fleet runs). Whether a group has ready jobs of
    the claimer's types is left to the pick (a group whose pick comes back short hands its
    slots on, which splits them exactly as if it had not been read: see Claimer.claim)."""
    J = t.jobs
    scan = scan_cte(t, ops, from_start, CENSUS_CTE)
    keys: Any = select(scan.c.g.label("g"), scan.c.n.label("n")).where(scan.c.g.is_not(None))
    if with_running:
        keys = union_all(keys, select(J.c.group_key, literal_column("0")).where(
            J.c.state == lit(S.RUNNING)).distinct())
    src = keys.subquery("k")
    # Only the heavier-than-default jobs are in ix_ready_weight (v4): none found means 1.
    # The bound is a literal, as in the index's predicate, so a generic plan can use it.
    weight = (
        select(J.c.weight)
        .where(J.c.state == lit(S.READY),
               ops.key_is(J.c.state, lit(S.READY), J.c.group_key, src.c.g),
               J.c.weight > literal_column("1"))
        .order_by(J.c.weight.desc())
        .limit(1)
        .scalar_subquery()
    )
    # What each group runs, counted once for all (ix_running: at most what the fleet
    # runs) rather than probed per group read
    R = J.alias("rn")
    run = (select(R.c.group_key, func.count().label("c")).where(R.c.state == lit(S.RUNNING))
           .group_by(R.c.group_key).subquery("r"))
    return (select(src.c.g, src.c.n, weight, func.coalesce(run.c.c, 0))
            .select_from(src.outerjoin(run, run.c.group_key == src.c.g)))


class Census:
    """The groups with runnable work, read in fair_share's rotation order (the names after
    ``cursor``, then from the start) only as far as a claim needs them.

    Every group that runs a job is read (its ratio is above 0); of those that run nothing
    (ratio 0: they take every slot before any other group does, in rotation order), only
    the first ones: once ``free`` of them are open, no group further on could get a slot
    from fair_share over all groups, so the split of what was read is that split exactly.

    Where the last census read every group and they were few (WHOLE), all are read again
    from the start in one statement (the rotation is then fair_share's alone): reading
    after the cursor and then wrapping round would take two.
    """

    def __init__(self, claimer: Claimer, types: list[str]) -> None:
        self.c = claimer
        self.types = types
        self.cursor = claimer.cursor
        self.demand: dict[str, GroupDemand] = {}
        self.gone: set[str] = set()  # groups that ran dry during this claim
        self.idle: set[str] = set()  # groups read that ran nothing then
        few = claimer.few_groups
        #: read every group from the start (see the class docstring)
        self.whole = few is not None and few <= WHOLE
        self.expect = (few or 0) + 8
        self.last: str | None = None if self.whole else self.cursor  # the scan's position
        #: past the end, reading from the start again
        self.wrapped = self.whole or self.cursor is None
        self.done = False  # every group with ready jobs has been read
        self.read_running = False
        self.scanned = 0  # groups the scan has read
        self.seen: set[str] = set()  # ... by name
        self.busy = 0  # groups that run jobs

    def open_idle(self) -> int:
        """Groups read that run nothing and may take a slot."""
        return sum(1 for d in self.demand.values()
                   if d.running == 0 and (d.cap is None or d.cap > 0))

    async def fill(self, conn: AsyncConnection, free: int) -> None:
        """Read on until ``free`` open groups that run nothing are known, or all are."""
        while not self.done and (self.whole or not self.read_running
                                 or self.open_idle() < free):
            lim = free - self.open_idle() + 4
            await self._more(conn, max(lim, self.expect) if self.whole else lim)
        if self.done:
            self.c.few_groups = self.scanned
        elif not self.whole:
            self.c.few_groups = None

    async def _more(self, conn: AsyncConnection, lim: int) -> None:
        db = self.c.db
        from_start = self.last is None
        with_running = not self.read_running
        key = ("census", from_start, with_running)
        stmt = db.stmts.get(key)
        if stmt is None:
            stmt = db.stmts[key] = census_query(db.t, db.ops, from_start, with_running)
        params: dict[str, Any] = {"lim": lim}
        if not from_start:
            params["after"] = self.last
        rows = (await conn.execute(stmt, params)).all()
        if with_running:
            self.busy = len({r[0] for r in rows if r[3]})
        self.read_running = True
        scanned = [r[0] for r in rows if r[1]]
        caps = self.c.settings.group_limits
        for g, n, w, r in rows:
            if g in self.gone:
                continue
            if (n and self.wrapped and not self.whole and self.cursor is not None
                    and g > self.cursor):
                continue  # read before the wrap
            cap = caps.get(g)
            if not int(r):
                self.idle.add(g)
            self.demand[g] = GroupDemand(int(w or 1), int(r),
                                         None if cap is None else max(cap - int(r), 0))
        self.seen.update(scanned)
        self.scanned += len(scanned)
        last = max(scanned) if scanned else None
        if last is not None:
            self.last = last
        if len(scanned) < lim:  # the end of the names
            if self.wrapped:
                self.done = True
            else:
                self.wrapped, self.last = True, None
        elif (self.wrapped and not self.whole and self.cursor is not None
              and last is not None and last > self.cursor):
            self.done = True  # back where the rotation started
        if self.done:
            # a group that runs jobs and was not met by a complete scan has no ready job
            for g in [g for g in self.demand if g not in self.seen]:
                del self.demand[g]

    def ran_dry(self, g: str) -> None:
        self.demand.pop(g, None)
        self.gone.add(g)


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

    async def pick_idle(self, conn: AsyncConnection, free: int, types: list[str],
                        after: str | None, taken: list[Any]) -> list[str] | None:
        """idle_pick_stmt: the groups it leased a job of (their rows join ``taken``), or
        None where the dialect has no such statement."""
        key = ("pickidle", tuple(types), after is None)
        stmt = self.db.stmts.get(key, False)
        if stmt is False:
            stmt = self.db.stmts[key] = idle_pick_stmt(self.db, types, after is None,
                                                       self.lease)
        if stmt is None:
            return None
        params: dict[str, Any] = {"free": free, "lim": 2 * free + 8}
        if after is not None:
            params["after"] = after
        rows = (await conn.execute(stmt, params)).all()
        taken += rows
        return [r[4] for r in rows]

    async def pick_many(self, conn: AsyncConnection, plan: dict[str, int], types: list[str],
                        taken: list[Any]) -> dict[str, int]:
        """Lease ``plan[g]`` of each group's best ready jobs in one statement; how many each
        group got. Their rows join ``taken``."""
        rows: list[Any] = []
        for gs, ns in _chunks(plan):
            stmt, bind = _many_stmt(self.db, len(gs), types, self.lease, True)
            rows += (await conn.execute(stmt, bind(gs, ns))).all()
        taken += rows
        return _per_group(r[4] for r in rows)

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

    async def pick_many(self, conn: AsyncConnection, plan: dict[str, int], types: list[str],
                        taken: list[Any]) -> dict[str, int]:
        rows: list[Any] = []
        for gs, ns in _chunks(plan):
            stmt, bind = _many_stmt(self.db, len(gs), types, None, False)
            rows += (await conn.execute(stmt, bind(gs, ns))).all()
        taken += [r[0] for r in rows]
        return _per_group(r[1] for r in rows)

    async def leased(self, conn: AsyncConnection, taken: list[Any]) -> list[Any]:
        if not taken:
            return []
        J, ops = self.db.t.jobs, self.db.ops
        ids = sorted(taken)
        await conn.execute(update(J).where(ops.in_ids(J.c.id, ids)).values(**self.lease))
        return list((await conn.execute(
            select(*claim_columns(self.db.t)).where(ops.in_ids(J.c.id, ids)))).all())


LeasePath = ReturningLease | PickThenLease


#: Groups per many-group pick statement (a UNION ALL of one part per group: SQLite allows
#: 500 parts at most).
PICK_CHUNK = 128


def _chunks(plan: dict[str, int]) -> list[tuple[list[str], list[int]]]:
    items = list(plan.items())
    return [([g for g, _ in items[i : i + PICK_CHUNK]], [n for _, n in items[i : i + PICK_CHUNK]])
            for i in range(0, len(items), PICK_CHUNK)]


def _per_group(keys: Any) -> dict[str, int]:
    got: dict[str, int] = {}
    for g in keys:
        got[g] = got.get(g, 0) + 1
    return got


def _many_stmt(db: Database, k: int, types: list[str], lease: dict[str, Any] | None,
               returning: bool) -> tuple[Any, Any]:
    """The pick of ``k`` groups' best jobs as one statement (DialectOps.pick_groups): with
    ``returning``, the UPDATE that leases them RETURNING claim_columns(); else the SELECT of
    (id, group_key) that locks them. Built once per (k, types) where the dialect's form
    depends on k, once per types where not."""
    key = ("pickmany", tuple(types), k, returning)
    got = db.stmts.get(key)
    if got is not None:
        return got  # type: ignore[no-any-return]
    J = db.t.jobs

    def pick(group: Any, n: Any) -> Select[Any]:
        return (select(J.c.id, J.c.group_key)
                .where(J.c.state == lit(S.READY), J.c.group_key == group, J.c.type.in_(types))
                .order_by(J.c.priority.desc(), J.c.id)
                .limit(n))

    sel, bind = db.ops.pick_groups(pick, k)
    stmt: Any = sel
    if returning:
        assert lease is not None
        ids = select(sel.subquery().c.id)
        stmt = update(J).where(db.ops.in_select(J.c.id, ids)).values(**lease).returning(
            *claim_columns(db.t))
    db.stmts[key] = (stmt, bind)
    return stmt, bind


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
        #: the last group that ran nothing and was served: fair share's rotation (ties
        #: among equal ratios) goes on after it (see policy.fair_share, Census)
        self.cursor: str | None = None
        #: how many groups had ready jobs at the last census that read them all, or None
        self.few_groups: int | None = None
        #: whether idle_pick_stmt is likely to find all it needs (see claim())
        self.idle_fits = True
        #: the last claim found the global concurrency cap full
        self.cap_full = False

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
        count_running = select(func.count()).select_from(J).where(J.c.state == lit(S.RUNNING))
        # The last claim found the global cap full: look before queueing for the gate (a
        # claim that can lease nothing must not hold up the one whose finalize just freed a
        # slot). Without the lock this only ever declines.
        if (s.concurrency is not None and self.cap_full
                and (await conn.execute(count_running)).scalar_one() >= s.concurrency):
            return []
        if s.needs_gate:
            await db.ops.lock_gate(conn)
        free = want
        if s.concurrency is not None:
            running_all = (await conn.execute(count_running)).scalar_one()
            self.cap_full = running_all >= s.concurrency
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
        firsts: list[str] | None = None
        if (not cached and free > 1 and not s.group_limits and self.few_groups is None
                and self.idle_fits and isinstance(path, ReturningLease)):
            # Many groups (the last census did not read them all): first the groups that
            # run nothing, one job each, without a census (see idle_pick_stmt)
            firsts = await path.pick_idle(conn, free, types, self.cursor, taken)
            if firsts:
                free -= len(firsts)
                self.cursor = max(firsts, key=rotation_key(self.cursor))
            # short: too many groups run something for the scan's window (or the names
            # ran out); the census says when it fits again
            self.idle_fits = firsts is not None and free == 0
        for _census in range(2 if free > 0 else 0):
            census: Census | None = None
            if known is not None and cached:
                demand = {known: GroupDemand(1)}
            else:
                census = Census(self, types)
                await census.fill(conn, free)
                demand = census.demand
                # idle_pick_stmt scans 2 x free + 8 groups: at most `busy` of them run jobs
                self.idle_fits = census.busy <= free
                self.groups_at, self.census_due = now, False
                # the groups with work: what the census found, and what was just leased
                # without it
                had = set(demand) | set(firsts or ())
                if len(had) == 1 and census.done:
                    self.single_group = next(iter(had))
                elif had:
                    self.single_group = None
                # else nothing is runnable now: the group known to be the only one stays
                # cached, so the next claim (say, after this worker's finalize released its
                # dependents) picks at once; if that group is dry then, the census runs
                # again as above
            idle = census.idle if census is not None else {known}
            served: list[str] = []
            # Work-conserving: a group with fewer runnable jobs than its share hands the
            # rest on (to groups read further on where needed).
            while free > 0 and demand:
                plan = fair_share(free, demand, rotate=True, after=self.cursor)
                exhausted = []
                asks = {g: n for g, n in sorted(plan.items()) if n > 0}
                if not asks:  # every group capped out
                    break
                if len(asks) == 1:
                    (g1, n1), = asks.items()
                    gots = {g1: await path.pick(conn, g1, n1, types, taken)}
                else:  # many groups: one statement, not one round trip per group
                    gots = await path.pick_many(conn, asks, types, taken)
                for g, n in asks.items():
                    got = gots.get(g, 0)
                    free -= got
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
                if census is not None and free > 0:
                    await census.fill(conn, free)  # (into demand: the same dict)
            if served:
                self.cursor = max(served, key=rotation_key(self.cursor))
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

"""The fair-share census: which groups have ready jobs of the claimer's types, the weight
of each and what it runs now, read from the claim's own index (``ix_ready``, walked group by
group) and only as far as the split of the free slots needs: groups that run nothing take
slots first, so once ``free`` of them are read no group further on could get one. Also the
census-free pick (one job from each of the next groups in rotation) for when few groups
run jobs. ``Claimer`` (claim.py) decides when to read it; docs/scheduling.md tells why."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Select,
    String,
    bindparam,
    func,
    literal_column,
    select,
    union_all,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .live_policy import group_budgets
from .policy import GroupDemand
from .sql import ONE, lit, opaque

if TYPE_CHECKING:
    from .claim import Claimer


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
    anchor = select(first.order_by(J.c.group_key).limit(ONE).scalar_subquery().label("g"),
                    literal_column("1").label("n"))
    scan = anchor.cte(name, recursive=True)
    step = select(
        select(inner.c.group_key)
        .where(inner.c.state == lit(S.READY),
               ops.key_after(inner.c.state, lit(S.READY), inner.c.group_key, scan.c.g))
        .order_by(inner.c.group_key)
        .limit(ONE)
        .scalar_subquery(),
        scan.c.n + literal_column("1"),
    ).where(scan.c.g.is_not(None), scan.c.n < opaque("lim"))
    return scan.union_all(step)


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
    # Where the index has every row (no partial indexes) the bound is left out: a group's
    # first entry from the top is its largest weight, where with the bound the probe read
    # a group of weight-1 jobs entry by entry to its end (MariaDB: 200 entries a group at
    # 100 groups of 200 jobs)
    heavy = [J.c.weight > literal_column("1")] if ops.has_partial_indexes else []
    weight = (
        select(J.c.weight)
        .where(J.c.state == lit(S.READY),
               ops.key_is(J.c.state, lit(S.READY), J.c.group_key, src.c.g), *heavy)
        .order_by(J.c.weight.desc())
        .limit(ONE)
        .scalar_subquery()
    )
    # What each group runs, counted once for all (ix_running: at most what the fleet
    # runs) rather than probed per group read
    R = J.alias("rn")
    run = (select(R.c.group_key, func.count().label("c")).where(R.c.state == lit(S.RUNNING))
           .group_by(R.c.group_key).subquery("r"))
    return (select(src.c.g, src.c.n, weight, func.coalesce(run.c.c, 0))
            .select_from(src.outerjoin(run, run.c.group_key == src.c.g)))


def others_query(t: S.Tables, ops: Any) -> Select[Any]:
    """One row: the nearest group with ready jobs before ``:g`` and the nearest after it
    in name order (NULL where there is none): whether a group other than ``:g`` has ready
    jobs, in two "first entry of an index range" probes of ix_ready (Claimer.claim's renewal
    of a known single group). A census would also read ``:g``'s whole backlog where the
    database has no loose index scan of its own (MariaDB reads a GROUP BY on the index's
    second column entry by entry, and the census's correlated probes as a ref on state)."""
    J = t.jobs
    g = bindparam("g", type_=String())
    ready = J.c.state == lit(S.READY)
    # (bounds written by the dialect: on PostgreSQL row comparisons, see key_after)
    before = (select(J.c.group_key)
              .where(ready, ops.key_before(J.c.state, lit(S.READY), J.c.group_key, g))
              .order_by(J.c.group_key.desc()).limit(1).scalar_subquery())
    after = (select(J.c.group_key)
             .where(ready, ops.key_after(J.c.state, lit(S.READY), J.c.group_key, g))
             .order_by(J.c.group_key).limit(1).scalar_subquery())
    return select(before.label("before"), after.label("after"))


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
        self.ran_out = False  # the names after the cursor ran out (the scan wrapped round)
        #: the starts each rated group's rate allowed, counted once per claim
        self.budget: dict[str, int] = {}

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
        live = self.c.live
        for g, n, w, r in rows:
            if g in self.gone:
                continue
            if (n and self.wrapped and not self.whole and self.cursor is not None
                    and g > self.cursor):
                continue  # read before the wrap
            cap = live.cap(g)
            if not int(r):
                self.idle.add(g)
            # a group's stored weight where set, else its heaviest ready job's
            left = None if cap is None else max(cap - int(r), 0)
            if g in self.budget:  # (its rate's budget, counted earlier in this claim)
                left = self.budget[g] if left is None else min(left, self.budget[g])
            self.demand[g] = GroupDemand(live.weight(g) or int(w or 1), int(r), left)
        if live.group_rates:
            await self._rate_caps(conn)
        self.seen.update(scanned)
        self.scanned += len(scanned)
        last = max(scanned) if scanned else None
        if last is not None:
            self.last = last
        if len(scanned) < lim:  # the end of the names
            if self.wrapped:
                self.done = True
            else:
                self.wrapped, self.last, self.ran_out = True, None, True
        elif (self.wrapped and not self.whole and self.cursor is not None
              and last is not None and last > self.cursor):
            self.done = True  # back where the rotation started
        if self.done:
            # a group that runs jobs and was not met by a complete scan has no ready job
            for g in [g for g in self.demand if g not in self.seen]:
                del self.demand[g]

    async def _rate_caps(self, conn: AsyncConnection) -> None:
        """Lower each rated group's share to the starts its rate still allows (counted
        under the gate, in the claim's transaction), once per group per claim."""
        live = self.c.live
        rates = {g: r for g in self.demand if g not in self.budget
                 and (r := live.group_rate(g)) is not None}
        if not rates:
            return
        budgets = await group_budgets(conn, self.c.db, rates)
        self.budget.update(budgets)
        for g, left in budgets.items():
            d = self.demand[g]
            self.demand[g] = GroupDemand(d.weight, d.running,
                                         left if d.cap is None else min(d.cap, left))

    def ran_dry(self, g: str) -> None:
        self.demand.pop(g, None)
        self.gone.add(g)

"""How a claim turns picked rows into leases: the two paths a dialect chooses between
(``ReturningLease``: UPDATE ... RETURNING; ``PickThenLease``: a locking SELECT, then the
UPDATE, where there is no RETURNING), the statements that pick many groups' best ready jobs
(priority, then age) with SKIP LOCKED in one statement, and the look of a claim passed over
(``ready_among``). The SET clauses of a lease, the columns a claim returns and the picks
that lease in one statement (one group's, the idle groups', the fair pick:
``fair_pick_stmt``) are in lease_stmts.py."""

from __future__ import annotations

from typing import Any, NamedTuple

from sqlalchemy import Integer, Select, String, bindparam, select, union_all, update
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .database import Database
from .lease_stmts import (
    claim_columns,
    fair_pick_stmt,
    idle_pick_stmt,
    lease_values,
    pick_and_lease_stmt,
)
from .settings import Settings
from .sql import ONE, lit


class FairPick(NamedTuple):
    """What fair_pick_stmt read: the groups it leased jobs of that ran nothing before (in
    no order), whether it read every group with ready jobs, and how many groups it read
    (None where it leased nothing: then it says nothing)."""

    idle: list[str]
    complete: bool
    seen: int | None


#: A claim passed over (Claimer.passed_over) looks whether up to this many of the groups
#: it picked from have a ready job it could run
RELOOK_GROUPS = 32


async def ready_among(db: Database, conn: AsyncConnection, groups: list[str],
                      types: list[str]) -> bool:
    """Whether one of ``groups`` has a committed ready job of ``types``, read without a
    lock, so a row another claim's pick holds is seen (InnoDB's SKIP LOCKED passes over
    rows another pick only read: see DialectOps.skip_locked_passes_unmatched)."""
    J = db.t.jobs
    stmt = db.stmt("claim.ready_among", lambda: select(J.c.id).where(
        J.c.state == lit(S.READY), J.c.group_key.in_(bindparam("gs", expanding=True)),
        J.c.type.in_(bindparam("ts", expanding=True))).limit(1))
    found = await conn.execute(stmt, {"gs": groups[:RELOOK_GROUPS], "ts": types})
    return found.first() is not None


class ReturningLease:
    """A group's pick and its lease in one statement, the rows back in the same round trip
    (UPDATE ... RETURNING). ``state``: what a lease sets (``leased``: held ahead)."""

    def __init__(self, db: Database, settings: Settings, state: str = S.RUNNING) -> None:
        self.db = db
        self.state = state
        self.lease = lease_values(db.t, settings.lease_ttl, settings.worker_id, state)

    async def pick(self, conn: AsyncConnection, g: str, n: int, types: list[str],
                   taken: list[Any]) -> int:
        """Lease up to ``n`` of ``g``'s best ready jobs; their rows join ``taken``."""
        key = ("pick", tuple(types), self.state)
        stmt = self.db.stmts.get(key)
        if stmt is None:  # built once per handler-type set
            stmt = self.db.stmts[key] = pick_and_lease_stmt(
                self.db, bindparam("g"), bindparam("n"), lambda col: col.in_(types), self.lease)
        rows = (await conn.execute(stmt, {"g": g, "n": n})).all()
        taken += rows
        return len(rows)

    async def take(self, conn: AsyncConnection, g: str, n: int, types: list[str]
                   ) -> list[Any]:
        """Lease up to ``n`` of ``g``'s best ready jobs: their rows (claim_columns())."""
        taken: list[Any] = []
        await self.pick(conn, g, n, types, taken)
        return taken

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

    async def pick_fair(self, conn: AsyncConnection, free: int, types: list[str],
                        after: str | None, lim: int, taken: list[Any]) -> FairPick | None:
        """fair_pick_stmt (its rows join ``taken``, as claim_columns()), or None where the
        dialect has no such statement."""
        key = ("pickfair", after is not None, self.state)
        stmt = self.db.stmts.get(key, False)
        if stmt is False:
            stmt = self.db.stmts[key] = fair_pick_stmt(self.db, after is not None, self.lease)
        if stmt is None:
            return None
        params: dict[str, Any] = {"free": free, "lim": lim, "types": types}
        if after is not None:
            params["after"] = after
        rows = (await conn.execute(stmt, params)).all()
        n = len(claim_columns(self.db.t))
        taken += [r[:n] for r in rows]
        if not rows:
            return FairPick([], False, None)
        return FairPick(sorted({r[4] for r in rows if not r[n]}), bool(rows[0][n + 1]),
                        int(rows[0][n + 2]))

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
    """Without UPDATE ... RETURNING: each group's pick locks its rows (SKIP LOCKED) and
    reads what the claim returns (claim_columns()) as it does; one UPDATE leases them all at
    the end. The rows are this claim's until commit, and the lease changes nothing they
    carry but ``attempts`` (+ 1): no SELECT reads them back. ``state``: what a lease sets."""

    def __init__(self, db: Database, settings: Settings, state: str = S.RUNNING) -> None:
        self.db = db
        self.state = state
        self.lease = lease_values(db.t, settings.lease_ttl, settings.worker_id, state)

    async def pick(self, conn: AsyncConnection, g: str, n: int, types: list[str],
                   taken: list[Any]) -> int:
        db, J = self.db, self.db.t.jobs

        def build(skip: bool) -> Any:
            cond = [J.c.state == lit(S.READY), J.c.group_key == bindparam("g"),
                    J.c.type.in_(types)]
            if skip:  # the ids this claim already picked (its locks would not skip them)
                cond.append(J.c.id.not_in(bindparam("taken", expanding=True)))
            return db.ops.skip_locked(select(*claim_columns(db.t)).where(*cond)
                                      .order_by(J.c.priority.desc(), J.c.id)
                                      .limit(bindparam("n", type_=Integer())))

        skip = bool(taken)
        stmt = db.stmt(("pickrows", tuple(types), skip), lambda: build(skip))
        bind: dict[str, Any] = {"g": g, "n": n}
        if skip:
            bind["taken"] = [r[0] for r in taken]
        picked = (await conn.execute(stmt, bind)).all()
        taken += picked
        return len(picked)

    async def take(self, conn: AsyncConnection, g: str, n: int, types: list[str]
                   ) -> list[Any]:
        """Lease up to ``n`` of ``g``'s best ready jobs: their rows (claim_columns())."""
        taken: list[Any] = []
        await self.pick(conn, g, n, types, taken)
        return await self.leased(conn, taken)

    async def pick_many(self, conn: AsyncConnection, plan: dict[str, int], types: list[str],
                        taken: list[Any]) -> dict[str, int]:
        # The rows this claim already picked are still `ready` (leased at the end) and its
        # own locks do not skip them: left out by id, or a group's pick would come back
        # short by them and hand its slots to others (an unfair split).
        skip = bool(taken)
        rows: list[Any] = []
        for gs, ns in _chunks(plan):
            if all(n == 1 for n in ns):  # (over many groups, every share is one slot)
                stmt, bind = _first_each_stmt(self.db, len(gs), types, skip)
            else:
                stmt, bind = _many_stmt(self.db, len(gs), types, None, False, skip)
            binds = bind(gs, ns)
            if skip:
                binds["taken"] = [r[0] for r in taken]
            rows += (await conn.execute(stmt, binds)).all()
        return _join(taken, rows)

    async def leased(self, conn: AsyncConnection, taken: list[Any]) -> list[Any]:
        if not taken:
            return []
        await conn.execute(self._lease_stmt(), {"ids": sorted(r[0] for r in taken)})
        return [(*r[:3], r[3] + 1, *r[4:]) for r in taken]

    def _lease_stmt(self) -> Any:
        """The UPDATE leasing the jobs ``:ids`` (built once)."""
        db, J = self.db, self.db.t.jobs
        key = "lease.ids" if self.state == S.RUNNING else f"lease.ids.{self.state}"
        return db.stmt(key, lambda: update(J).where(
            db.ops.in_ids_param(J.c.id, "ids")).values(**self.lease))


LeasePath = ReturningLease | PickThenLease


#: Groups per many-group pick statement (a UNION ALL of one part per group: SQLite allows
#: 500 parts at most).
PICK_CHUNK = 128


def _chunks(plan: dict[str, int]) -> list[tuple[list[str], list[int]]]:
    items = list(plan.items())
    return [([g for g, _ in items[i : i + PICK_CHUNK]], [n for _, n in items[i : i + PICK_CHUNK]])
            for i in range(0, len(items), PICK_CHUNK)]


def _join(taken: list[Any], rows: list[Any]) -> dict[str, int]:
    """Add the picked ``rows`` (claim_columns()) to ``taken``; how many each group got. A
    locking pick does not skip the rows its own transaction locked, so those an earlier
    pick of the same claim took are dropped (and not counted)."""
    seen = {r[0] for r in taken}
    fresh = []
    for r in rows:
        if r[0] not in seen:
            seen.add(r[0])
            fresh.append(r)
    taken += fresh
    return _per_group(r[4] for r in fresh)


def _per_group(keys: Any) -> dict[str, int]:
    got: dict[str, int] = {}
    for g in keys:
        got[g] = got.get(g, 0) + 1
    return got


def _first_each_stmt(db: Database, k: int, types: list[str], skip: bool
                     ) -> tuple[Any, Any]:
    """The SELECT that locks and reads (claim_columns()) the best ready job of each of ``k``
    groups, SKIP LOCKED, leaving out the ids bound as ``:taken`` where ``skip``: the groups
    a derived table of binds, each joined by id to its pick, a correlated LIMIT 1 sub-select
    that locks (so it passes over rows another claim holds, as a part of _many_stmt's
    UNION ALL does). One sub-select to plan, where the UNION ALL has k: MariaDB plans each
    part (and estimates its range) anew at every call. For PickThenLease where every
    group's share is one job, as over many groups; built once per (k, types)."""
    key = ("pickfirst", tuple(types), k, skip)
    got = db.stmts.get(key)
    if got is not None:
        return got  # type: ignore[no-any-return]
    J = db.t.jobs
    X = J.alias("x")
    names = union_all(*[select(bindparam(f"g{i}", type_=String()).label("g"))
                        for i in range(k)]).subquery("v")
    cond = [X.c.state == lit(S.READY), X.c.group_key == names.c.g, X.c.type.in_(types)]
    if skip:
        cond.append(X.c.id.not_in(bindparam("taken", expanding=True)))
    first = db.ops.skip_locked(select(X.c.id).where(*cond)
                               .order_by(X.c.priority.desc(), X.c.id).limit(ONE))
    # the outer read locks too: our own lock, so it reads the row's newest version
    stmt = db.ops.skip_locked(select(*claim_columns(db.t)).select_from(
        names.join(J, J.c.id == first.scalar_subquery())).where(J.c.state == lit(S.READY)))

    def bind(groups: list[str], _ns: list[int]) -> dict[str, Any]:
        return {f"g{i}": g for i, g in enumerate(groups)}

    db.stmts[key] = (stmt, bind)
    return stmt, bind


def _many_stmt(db: Database, k: int, types: list[str], lease: dict[str, Any] | None,
               returning: bool, skip: bool = False) -> tuple[Any, Any]:
    """The pick of ``k`` groups' best jobs as one statement (DialectOps.pick_groups): with
    ``returning``, the UPDATE that leases them RETURNING claim_columns(); else the SELECT
    that locks them and reads their claim_columns(), with ``skip`` leaving out the ids
    bound as ``:taken``. Built once per (k, types) where the dialect's form depends on k,
    once per types where not."""
    key = ("pickmany", tuple(types), k, returning, skip)
    got = db.stmts.get(key)
    if got is not None:
        return got  # type: ignore[no-any-return]
    J = db.t.jobs

    cols = (J.c.id, J.c.group_key) if returning else claim_columns(db.t)

    def pick(group: Any, n: Any) -> Select[Any]:
        cond = [J.c.state == lit(S.READY), J.c.group_key == group, J.c.type.in_(types)]
        if skip:
            cond.append(J.c.id.not_in(bindparam("taken", expanding=True)))
        return (select(*cols).where(*cond).order_by(J.c.priority.desc(), J.c.id).limit(n))

    sel, bind = db.ops.pick_groups(pick, k)
    stmt: Any = sel
    if returning:
        assert lease is not None
        ids = select(sel.subquery().c.id)
        stmt = update(J).where(db.ops.in_select(J.c.id, ids)).values(**lease).returning(
            *claim_columns(db.t))
    db.stmts[key] = (stmt, bind)
    return stmt, bind

"""The ranked, capped claim: one short transaction that leases up to N runnable jobs.

Inside it: promote due ``scheduled`` jobs, take the gate (where a global cap must be counted
exactly), count what runs per group, split the free slots by fair share, pick the best jobs
of each group (priority, then age) with SKIP LOCKED, and lease them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import Select, bindparam, func, literal_column, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .completer import lit
from .policy import GroupDemand, fair_share
from .timeutil import db_now, utcnow_plus

if TYPE_CHECKING:
    from .queue import JobQueue


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


#: At most one promotion sweep per this many seconds per worker (capped by poll_interval):
#: a busy worker claims hundreds of times a second, but a due retry can wait a tick.
PROMOTE_EVERY = 0.1
#: How long a census that found a single group with runnable jobs is trusted.
GROUPS_EVERY = 0.1


async def promote_due(q: JobQueue, conn: AsyncConnection) -> None:
    """``scheduled`` jobs whose time has come become ``ready``."""
    J = q._t.jobs
    await conn.execute(
        update(J).where(J.c.state == lit(S.SCHEDULED), J.c.run_after <= db_now())
        .values(state=S.READY)
    )


def group_demand_query(q: JobQueue, types: list[str]) -> Select[Any]:
    """Groups with runnable work: (group, weight, running). One row per known group, each
    answered by index probes (a ready row exists; max weight; running count), so its cost
    follows the number of groups, never the depth of a backlog."""
    J, G = q._t.jobs, q._t.groups
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


async def _demand(q: JobQueue, conn: AsyncConnection, types: list[str]) -> dict[str, GroupDemand]:
    """Groups with runnable jobs of ``types``: their weight, what they run, their cap room."""
    rows = (await conn.execute(group_demand_query(q, types))).all()
    demand: dict[str, GroupDemand] = {}
    for g, w, r in rows:
        cap = q.group_limits.get(g)
        demand[g] = GroupDemand(int(w or 1), int(r), None if cap is None else max(cap - int(r), 0))
    return demand


def lease_values(q: JobQueue, ttl: Any = None, owner: Any = None) -> dict[str, Any]:
    """The SET clauses of a lease: this worker's for ``lease_ttl`` by default (the one-call
    routine passes its own variables' expressions)."""
    J = q._t.jobs
    return {
        "state": S.RUNNING,
        "lease_owner": q.worker_id if owner is None else owner,
        "lease_expires": utcnow_plus(q.lease_ttl if ttl is None else ttl),
        "attempts": J.c.attempts + 1,
        "started_at": db_now(),
        "cancel_requested": False,
    }


def claim_columns(q: JobQueue) -> tuple[Any, ...]:
    """What a lease returns, in the order Claimed is built from (see _claimed)."""
    J = q._t.jobs
    return (J.c.id, J.c.type, J.c.args, J.c.attempts, J.c.group_key, J.c.timeout,
            J.c.checkpoint, J.c.parent_id, J.c.priority, J.c.has_dependents)


def pick_and_lease_stmt(q: JobQueue, group: Any, n: Any, of_types: Any,
                        lease: dict[str, Any]) -> Any:
    """UPDATE ... WHERE id IN (the best ``n`` ready jobs of ``group`` whose type matches
    ``of_types``, SKIP LOCKED) SET ``lease`` RETURNING claim_columns()."""
    J = q._t.jobs
    pick = q._ops.skip_locked(
        select(J.c.id)
        .where(J.c.state == lit(S.READY), J.c.group_key == group, of_types(J.c.type))
        .order_by(J.c.priority.desc(), J.c.id)
        .limit(n)
    )
    # in_select: on PostgreSQL the pick is an InitPlan feeding a primary-key probe, whatever
    # the planner settings (the one-call routine runs with nested loops off)
    return update(J).where(q._ops.in_select(J.c.id, pick)).values(**lease).returning(
        *claim_columns(q))


def _pick_and_lease(q: JobQueue, types: list[str]) -> Any:
    """pick_and_lease_stmt() with bind parameters ``g`` and ``n``, built once per
    handler-type set (the lease values are constants of this queue)."""
    key = ("pick", tuple(types))
    stmt = q._stmts.get(key)
    if stmt is None:
        stmt = q._stmts[key] = pick_and_lease_stmt(
            q, bindparam("g"), bindparam("n"), lambda col: col.in_(types), lease_values(q))
    return stmt


def _promotion_due(q: JobQueue, now: float, quick: bool) -> bool:
    every = q.poll_interval if quick else min(PROMOTE_EVERY, q.poll_interval)
    return now - q._promoted_at >= every


def _known_group(q: JobQueue, now: float, quick: bool) -> str | None:
    """The one group with runnable jobs, if a recent census found just one and fair share
    has nothing to split (no group caps): claims may skip the census for a moment. A new
    group is seen within GROUPS_EVERY, or at once when the known one runs dry."""
    if q._single_group is None or q.group_limits:
        return None
    window = q.poll_interval if quick else min(GROUPS_EVERY, q.poll_interval)
    return q._single_group if now - q._groups_at < window else None


@dataclass
class LeaseAsk:
    """A claim that rides along with a finalize (PostgreSQL's one-call routine, see
    Completer.finish_in_one_call): after the finalize has released what it releases, the
    same call leases up to ``n`` ready jobs of ``group`` and ``types``: the claim() of the
    known single group, without its round trip. ``rows``: what it leased, as
    claim_columns(); None while not done (the routine declined, or was not called)."""

    group: str
    types: list[str]
    n: int
    rows: list[Any] | None = None
    #: the rows as claim() returns them (see asked_claims)
    claimed: list[Claimed] = field(default_factory=list)


def lease_ask(q: JobQueue, want: int, types: list[str], quick: bool) -> LeaseAsk | None:
    """A LeaseAsk where claim() would do nothing but pick from its known group: no
    promotion due, no gate, no counted cap or limit; else None (claim normally)."""
    now = time.monotonic()
    if (want <= 0 or not types or q._needs_gate or q.concurrency is not None or q._db_limits
            or _promotion_due(q, now, quick)):
        return None
    group = _known_group(q, now, quick)
    return None if group is None else LeaseAsk(group, types, want)


def asked_claims(q: JobQueue, ask: LeaseAsk) -> list[Claimed]:
    """The jobs ``ask`` leased, as claim() would return them. A short pick leaves the census
    to the next claim (as claim() does); an empty one makes it due at once."""
    rows = ask.rows or []
    if not rows:
        q._groups_at = 0.0
    elif len(rows) < ask.n:
        q._census_due = True
    return _claimed(rows)


def _claimed(rows: list[Any]) -> list[Claimed]:
    """Leased rows (claim_columns()) in pick order (RETURNING rows come back unordered: a
    prefetched job starts after the better ones claimed with it). By position: a Row's
    attribute look-up costs more, and this runs for every job."""
    rows = sorted(rows, key=lambda r: (-r[8], r[0]))
    return [Claimed(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], bool(r[9])) for r in rows]


async def claim(
    q: JobQueue, conn: AsyncConnection, want: int, types: list[str], quick: bool = False
) -> list[Claimed]:
    """Lease up to ``want`` jobs of ``types`` on ``conn`` (inside a write transaction).

    ``quick``: an idle worker was just woken (a job was enqueued or released): go straight for
    it. The promotion sweep and the census then run at most once per ``poll_interval`` (a
    tick) instead of every PROMOTE_EVERY / GROUPS_EVERY."""
    J = q._t.jobs
    now = time.monotonic()
    if _promotion_due(q, now, quick):
        await promote_due(q, conn)
        q._promoted_at = now
    if q._needs_gate:
        await q._ops.lock_gate(conn)
    free = want
    if q.concurrency is not None:
        running_all = (await conn.execute(
            select(func.count()).select_from(J).where(J.c.state == lit(S.RUNNING))
        )).scalar_one()
        free = min(free, q.concurrency - running_all)
    for limit in q._db_limits:
        free = min(free, await limit._budget(q, conn))
    if free <= 0:
        return []
    lease = lease_values(q)
    cols = claim_columns(q)
    returning = q._ops.update_returning
    ids: list[int] = []
    out: list[Any] = []
    # With one group only (seen recently, no group caps) fair share has nothing to split:
    # skip the per-group census for a moment (at the latest, the claim that follows at once
    # holds it when the known group runs dry).
    known = _known_group(q, now, quick)
    cached = known is not None
    for _census in range(2):
        if known is not None and cached:
            demand = {known: GroupDemand(1)}
        else:
            demand = await _demand(q, conn, types)
            q._groups_at, q._census_due = now, False
            if len(demand) == 1:
                q._single_group = next(iter(demand))
            elif demand:
                q._single_group = None
            # else nothing is runnable now: the group known to be the only one stays cached,
            # so the next claim (say, after this worker's finalize released its dependents)
            # picks at once; if that group is dry then, the census runs again as above
        # Work-conserving: a group with fewer runnable jobs than its share hands the rest on.
        for _ in range(len(demand) + 1):
            if free <= 0 or not demand:
                break
            plan = fair_share(free, demand)
            exhausted = []
            for g, n in sorted(plan.items()):
                if n <= 0:
                    continue
                if returning:
                    # One statement: pick (SKIP LOCKED) and lease, rows back in the same trip.
                    got_rows = (await conn.execute(
                        _pick_and_lease(q, types), {"g": g, "n": n}
                    )).all()
                    out += got_rows
                    got = len(got_rows)
                else:
                    cond = [J.c.state == lit(S.READY), J.c.group_key == g, J.c.type.in_(types)]
                    if ids:
                        cond.append(J.c.id.not_in(ids))
                    pick = q._ops.skip_locked(
                        select(J.c.id).where(*cond).order_by(J.c.priority.desc(), J.c.id)
                        .limit(n)
                    )
                    picked = [r[0] for r in await conn.execute(pick)]
                    ids += picked
                    got = len(picked)
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
        if out or ids:
            # The known group ran short, not dry: hand these jobs over now (a DAG step waits
            # on them); the worker claims again at once, and that claim looks for other
            # groups if the known one is dry by then.
            q._census_due = True
            break
        cached = False  # the one known group ran dry: look for others now
    if ids:
        ids.sort()
        await conn.execute(update(J).where(q._ops.in_ids(J.c.id, ids)).values(**lease))
        out = list((await conn.execute(select(*cols).where(q._ops.in_ids(J.c.id, ids)))).all())
    if not out:
        return []
    for limit in q._db_limits:
        await limit._consume(q, conn, len(out))
    return _claimed(out)

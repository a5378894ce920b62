"""The ranked, capped claim: one short transaction that leases up to N runnable jobs.

Inside it: promote due ``scheduled`` jobs, take the gate (where a global cap must be counted
exactly), count what runs per group, split the free slots by fair share, pick the best jobs
of each group (priority, then age) with SKIP LOCKED, and lease them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Select, func, select, update
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
    weight = (
        select(J.c.weight)
        .where(J.c.state == lit(S.READY), J.c.group_key == G.c.group_key)
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


async def claim(q: JobQueue, conn: AsyncConnection, want: int, types: list[str]) -> list[Claimed]:
    """Lease up to ``want`` jobs of ``types`` on ``conn`` (inside a write transaction)."""
    J = q._t.jobs
    await promote_due(q, conn)
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
    rows = (await conn.execute(group_demand_query(q, types))).all()
    demand: dict[str, GroupDemand] = {}
    for g, w, r in rows:
        cap = q.group_limits.get(g)
        demand[g] = GroupDemand(int(w or 1), int(r), None if cap is None else max(cap - int(r), 0))
    ids: list[int] = []
    # Work-conserving: a group that has fewer runnable jobs than its share hands the rest on.
    for _ in range(len(demand) + 1):
        if free <= 0 or not demand:
            break
        plan = fair_share(free, demand)
        exhausted = []
        for g, n in sorted(plan.items()):
            if n <= 0:
                continue
            cond = [J.c.state == lit(S.READY), J.c.group_key == g, J.c.type.in_(types)]
            if ids:
                cond.append(J.c.id.not_in(ids))
            stmt = q._ops.skip_locked(
                select(J.c.id).where(*cond).order_by(J.c.priority.desc(), J.c.id).limit(n)
            )
            got = [r[0] for r in await conn.execute(stmt)]
            ids += got
            free -= len(got)
            d = demand[g]
            if len(got) < n:
                exhausted.append(g)
            else:
                demand[g] = GroupDemand(d.weight, d.running + len(got),
                                        None if d.cap is None else d.cap - len(got))
        for g in exhausted:
            demand.pop(g)
        if not exhausted:
            break
    if not ids:
        return []
    ids.sort()
    lease = {
        "state": S.RUNNING,
        "lease_owner": q.worker_id,
        "lease_expires": utcnow_plus(q.lease_ttl),
        "attempts": J.c.attempts + 1,
        "started_at": db_now(),
        "cancel_requested": False,
    }
    cols = (J.c.id, J.c.type, J.c.args, J.c.attempts, J.c.group_key, J.c.timeout,
            J.c.checkpoint, J.c.parent_id)
    lease_stmt = update(J).where(J.c.id.in_(ids)).values(**lease)
    if q._ops.update_returning:
        out = (await conn.execute(lease_stmt.returning(*cols))).all()
    else:
        await conn.execute(lease_stmt)
        out = (await conn.execute(select(*cols).where(J.c.id.in_(ids)))).all()
    for limit in q._db_limits:
        await limit._consume(q, conn, len(out))
    return sorted(
        (Claimed(r.id, r.type, r.args, r.attempts, r.group_key, r.timeout, r.checkpoint,
                 r.parent_id) for r in out),
        key=lambda c: c.id,
    )

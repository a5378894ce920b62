"""The statements of a lease: its SET clauses (``lease_values``), the columns a claim
returns (``claim_columns``), and the picks that lease in one statement: one group's best
ready jobs (priority, then age, SKIP LOCKED: ``pick_and_lease_stmt``, also inside
PostgreSQL's one-call routine), the best job of each group that runs nothing
(``idle_pick_stmt``), and the census, split and picks at once (``fair_pick_stmt``). The
lease paths that send them are in lease.py."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Integer,
    Select,
    String,
    bindparam,
    select,
    text,
    update,
)

from . import schema as S
from .census import scan_cte
from .database import Database
from .sql import ONE, lit, opaque
from .timeutil import db_now, utcnow_plus


def lease_values(t: S.Tables, ttl: Any, owner: Any, state: str = S.RUNNING) -> dict[str, Any]:
    """The SET clauses of a lease to ``owner`` for ``ttl`` seconds (values, or the one-call
    routine's variables' expressions). ``state``: ``leased`` for a job held ahead (see
    Slots.take_over)."""
    J = t.jobs
    return {
        "state": state,
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
            .limit(opaque("free")).subquery("k"))

    def pick(group: Any) -> Select[Any]:
        return (select(J.c.id)
                .where(J.c.state == lit(S.READY), J.c.group_key == group, J.c.type.in_(types))
                .order_by(J.c.priority.desc(), J.c.id)
                .limit(ONE))

    sel = db.ops.pick_each(keys, pick)
    if sel is None:
        return None
    return update(J).where(db.ops.in_select(J.c.id, sel)).values(**lease).returning(
        *claim_columns(db.t))


def fair_pick_stmt(db: Database, with_after: bool, lease: dict[str, Any]) -> Any:
    """Where the dialect can (DialectOps.fair_pick_sql), one statement that reads the
    groups with ready jobs (up to ``:lim`` of them in rotation order after ``:after``) and
    what each runs, splits ``:free`` slots among them as fair_share(rotate=True) does, and
    leases each group's share of its best jobs (SKIP LOCKED), RETURNING claim_columns(),
    then the group's running count before the claim, whether every group with ready jobs
    was read, and how many were; else None.

    Where not every group was read, it serves only groups that run nothing, one job each
    (what idle_pick_stmt does). Where a group's pick comes back short (no job of the
    worker's types, rows locked by another claim), the slots it left are the census's to
    split (see Claimer.claim)."""
    sql = db.ops.fair_pick_sql(with_after)
    if sql is None:
        return None
    J = db.t.jobs
    # the types as literals (the statement is built per set of types): the plan's
    # estimates then do not depend on the binds, so it is planned once, not at every call
    fp = (text(sql).bindparams(bindparam("types", type_=String(), expanding=True,
                                         literal_execute=True))
          .columns(id=BigInteger(), running=Integer(), complete=Boolean(), nseen=Integer())
          .cte("fp"))
    # The picked ids as in_select's InitPlan (an UPDATE ... FROM the pick is planned as a
    # hash join over a scan of the whole table), the pick's own columns looked up by id,
    # or once where they are the same in every row (the CTE is evaluated once)
    def of_pick(col: Any, by_id: bool = False) -> Any:
        sel = select(col)
        return (sel.where(fp.c.id == J.c.id) if by_id else sel.limit(ONE)).scalar_subquery()

    return update(J).where(db.ops.in_select(J.c.id, select(fp.c.id))).values(
        **lease).returning(*claim_columns(db.t), of_pick(fp.c.running, True),
                           of_pick(fp.c.complete), of_pick(fp.c.nseen))

"""The row statements of the general fenced finalize (``Finalizer.finish_detailed`` in
finalize.py), each run in the caller's transaction: the locking read that fences the
outcomes, and the UPDATEs that end an attempt by what happened to it. What happened is
decided in finalize.py; a snooze's write is snooze.py's, a failure's history history.py's.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .database import Database
from .sql import chunks, lit
from .timeutil import utcnow_plus

#: the lease an ended attempt gives up
_CLEARED: dict[str, Any] = {"lease_owner": None, "lease_expires": None}


async def lock_leased(db: Database, conn: AsyncConnection, ids: list[int]) -> list[Any]:
    """Lock the rows among ``ids`` (sorted) that are leased (running, or held ahead), in id
    order, and read what the fence and settle() need of them: id, attempts, lease_owner,
    attempt_limit, max_attempts, cancel_requested, cancelled_by, parent_id, has_dependents."""
    J = db.t.jobs
    # parent_id comes with the lock (it never changes), so settle() need not look it up.
    # Dependents are NOT read here: an edge committed while we waited for the row lock
    # would be invisible to this statement's snapshot (PostgreSQL, READ COMMITTED). The
    # row's own has_dependents is (a locking read returns the row's newest version, and
    # an edge sets it under this row's lock): where it is false, settle() skips the
    # look-up of dependents.
    stmts = db.stmts
    lock = stmts.get("finish.lock")
    if lock is None:
        lock = stmts["finish.lock"] = db.ops.for_update(
            select(J.c.id, J.c.attempts, J.c.lease_owner, J.c.attempt_limit,
                   J.c.max_attempts, J.c.cancel_requested, J.c.cancelled_by, J.c.parent_id,
                   J.c.has_dependents)
            .where(db.ops.in_ids_param(J.c.id, "ids"),
                   J.c.state.in_([lit(x) for x in S.LEASED_STATES]))
            .order_by(J.c.id)
        )
    rows: list[Any] = []
    for part in chunks(ids):
        rows += (await conn.execute(lock, {"ids": part})).all()
    return rows


async def end_retry(db: Database, conn: AsyncConnection, job_id: int,
                    error: dict[str, Any] | None, delay: float, errors: dict[str, Any]) -> None:
    """A failed attempt with attempts left: ``scheduled`` again in ``delay`` seconds.
    ``errors``: the failure's history columns (``errors``, and ``trace`` where traced)."""
    J = db.t.jobs
    await conn.execute(
        update(J).where(J.c.id == job_id).values(
            state=S.SCHEDULED, error=error, run_after=utcnow_plus(delay),
            **errors, **_CLEARED,
        )
    )


async def end_failed(db: Database, conn: AsyncConnection, job_id: int,
                     error: dict[str, Any] | None, now: Any, errors: dict[str, Any]) -> None:
    """A failed attempt with none left (or not retryable): ``failed`` for good, at ``now``;
    ``errors`` as end_retry's."""
    J = db.t.jobs
    await conn.execute(
        update(J).where(J.c.id == job_id).values(
            state=S.FAILED, error=error, finished_at=now, live_key=None,
            **errors, **_CLEARED,
        )
    )


async def end_cancelled(db: Database, conn: AsyncConnection, job_id: int,
                        error: dict[str, Any], now: Any) -> None:
    """An attempt that ended in (or met) a cancel request: ``cancelled``, at ``now``."""
    J = db.t.jobs
    await conn.execute(
        update(J).where(J.c.id == job_id).values(
            state=S.CANCELLED, error=error, finished_at=now, live_key=None, **_CLEARED
        )
    )


async def end_released(db: Database, conn: AsyncConnection, job_id: int) -> None:
    """An attempt interrupted by shutdown: ``ready`` again at once, and it does not count."""
    J = db.t.jobs
    await conn.execute(
        update(J).where(J.c.id == job_id).values(
            state=S.READY, attempt_limit=J.c.attempt_limit + 1,
            releases=J.c.releases + 1, **_CLEARED
        )
    )


async def end_done(db: Database, conn: AsyncConnection, done_rows: list[dict[str, Any]],
                   now: Any) -> None:
    """Successes (``done_rows``: ``i`` the job id, ``r`` its result): ``done`` at ``now``."""
    J = db.t.jobs
    stmts = db.stmts
    done_vals = dict(state=S.DONE, error=None, finished_at=now, live_key=None, **_CLEARED)
    # No result (None) is common: those rows share one set-based UPDATE.
    plain = sorted(r["i"] for r in done_rows if r["r"] is None)
    rich = [r for r in done_rows if r["r"] is not None]
    upd = stmts.get("finish.done")
    if upd is None:
        upd = update(J).where(db.ops.in_ids_param(J.c.id, "ids")).values(
            result=None, **done_vals)
        # Not "RETURNING EXISTS (dependents)": with a skewed deps table (100k jobs
        # waiting on one) PostgreSQL's generic plan probes it by a sequential scan per
        # row; settle()'s one id-array look-up stays on the index.
        stmts["finish.done"] = upd
    for part in chunks(plain):
        await conn.execute(upd, {"ids": part})
    if rich:
        await conn.execute(
            update(J).where(J.c.id == bindparam("i")).values(
                result=bindparam("r", type_=J.c.result.type), **done_vals
            ),
            rich,
        )

"""External steps: DAG nodes no worker runs (an approval, a payment provider's webhook, a
human review, a tool call answered later).

An external step (kind ``external``) waits on its dependencies like any job; once they are
done it becomes ``external`` (never ``ready``: no claim looks at it) and its deadline,
``lease_expires``, is set to now + its ``timeout`` (None: no deadline; no worker ever leases
such a row, so the column is free). ``complete(id, result)`` makes it ``done`` and
``fail(id, error)`` ``failed``, each in one transaction that locks the row first and then
settles what follows (dependents released or cancelled, containers rolled up) exactly as a
worker's finalize does. Either refuses, with InvalidStateError and nothing changed, a job
that is not ``external``: a second ``complete()``, or one after the timeout, says what
the step already is. Past its deadline a worker's sweep (the reclaimer's loop) fails it,
one row at a time under its lock, so two sweeps or a sweep racing a ``complete()`` end it
once."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .batch import check_json
from .database import Database
from .errors import InvalidJobError, InvalidStateError, JobNotFoundError
from .sql import lit
from .timeutil import db_now, utcnow_plus

if TYPE_CHECKING:
    from .core import Core

log = logging.getLogger("aiojobqueue.worker")

#: the most steps one sweep fails (the rest: the next sweep)
SWEEP_BATCH = 200


async def arm(db: Database, conn: AsyncConnection, ids: Sequence[int]) -> None:
    """Steps inserted straight into ``external`` (nothing to wait for): start now."""
    J = db.t.jobs
    await conn.execute(update(J).where(J.c.id.in_(sorted(ids))).values(
        started_at=db_now(), lease_expires=utcnow_plus(J.c.timeout)))


def failure(error: Any) -> dict[str, Any]:
    """The stored error of ``fail(id, error)``: a message, or a JSON dict kept as given
    (with a ``type`` and ``message`` added where missing)."""
    if error is None:
        return {"type": "ExternalFailed", "message": "failed by fail()"}
    if isinstance(error, str):
        return {"type": "ExternalFailed", "message": error}
    if isinstance(error, dict):
        check_json(error, "error")
        return {"type": "ExternalFailed", "message": "", **error}
    raise InvalidJobError(f"error must be a str, a JSON dict or None: {error!r}")


async def finish(core: Core, conn: AsyncConnection, job_id: int, state: str,
                 result: Any = None, error: dict[str, Any] | None = None) -> None:
    """End the external step ``job_id`` as ``state`` (done or failed) and settle what
    follows; InvalidStateError (nothing changed) unless it is ``external`` now."""
    J = core.db.t.jobs
    row = (await conn.execute(core.db.ops.for_update(
        select(J.c.id, J.c.kind, J.c.state, J.c.parent_id, J.c.finished_at)
        .where(J.c.id == job_id)))).first()
    if row is None:
        raise JobNotFoundError(f"no job with id {job_id}")
    if row.state != S.EXTERNAL:
        raise InvalidStateError(refusal(row))
    await conn.execute(update(J).where(J.c.id == job_id).values(
        state=state, result=result, error=error, finished_at=db_now(), live_key=None,
        lease_expires=None))
    await core.settler.settle(conn, [(job_id, state)], {job_id: row.parent_id})


def refusal(row: Any) -> str:
    """Why complete()/fail() changed nothing for ``row``."""
    if row.kind != S.EXTERNAL_KIND:
        return f"job {row.id} is not an external step ({row.state}): nothing changed"
    if row.state in S.TERMINAL:
        return (f"external step {row.id} is already {row.state} (since {row.finished_at}): "
                "nothing changed")
    return f"external step {row.id} is {row.state} (waiting for its dependencies): nothing changed"


def timed_out(timeout: float | None) -> dict[str, Any]:
    return {"type": "ExternalTimeout",
            "message": f"not completed within its timeout of {timeout}s"}


async def sweep(core: Core) -> int:
    """Fail the external steps past their deadline (a few at a time). Returns how many."""
    db = core.db
    J = db.t.jobs
    due = (J.c.state == lit(S.EXTERNAL), J.c.lease_expires < db_now())

    async def any_due(conn: AsyncConnection) -> bool:
        return (await conn.execute(select(J.c.id).where(*due).limit(1))).first() is not None

    async def fail_due(conn: AsyncConnection) -> int:
        rows = (await conn.execute(db.ops.skip_locked(
            select(J.c.id, J.c.parent_id, J.c.timeout).where(*due).order_by(J.c.id)
            .limit(SWEEP_BATCH)))).all()
        for r in rows:  # locked: a complete() waits, then finds it failed
            await conn.execute(update(J).where(J.c.id == r.id).values(
                state=S.FAILED, error=timed_out(r.timeout), finished_at=db_now(),
                live_key=None, lease_expires=None))
        if rows:
            await core.settler.settle(conn, [(r.id, S.FAILED) for r in rows],
                                      {r.id: r.parent_id for r in rows})
        return len(rows)

    if not await db.read(any_due):
        return 0
    n = await db.write(fail_due)
    if n:
        log.warning("%d external step(s) failed: past their timeout", n)
    return n

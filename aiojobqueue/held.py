"""Held slots (docs/scheduling.md): a job held ahead (state ``leased``: Slots.take_over)
starts in one of its worker's slots when that slot's job ends, and the transaction that
writes that job's outcome makes the held row ``running`` first. So the caps' count of the
worker's rows in ``running`` never drops below what it really runs. Here: which held jobs
a batch's outcomes carry (``swaps``), and that swap (``swap_in``, which
Finalizer.swap_in runs), its row locks taken in the heartbeat's order.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from sqlalchemy import bindparam, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .database import Database
from .settings import Settings
from .sql import chunks, lit
from .timeutil import db_now, utcnow_plus

if TYPE_CHECKING:
    from .finalize import Outcome


def swaps(batch: Iterable[Outcome]) -> list[tuple[int, int]]:
    """The held jobs started in the slots of ``batch``'s attempts (Outcome.swap)."""
    return [o.swap for o in batch if o.swap is not None]


async def swap_in(db: Database, settings: Settings, conn: AsyncConnection,
                  started: Sequence[tuple[int, int]], ending: Sequence[Outcome] = ()) -> None:
    """Make the held jobs ``started`` (id, attempt: leased to this worker, then started
    in the slots of attempts that ended) ``running``, in the transaction that writes
    those attempts' outcomes and before them: the caps' count of this worker's rows
    never drops below what it really runs. Fenced like a finalize; a row whose lease
    was lost changes nothing (its heartbeat stops the attempt)."""
    if not started:
        return
    J, s = db.t.jobs, settings
    # Lock the held rows and the batch's (``ending``) in id order first: this
    # transaction then takes its row locks in one order, as the heartbeat's one
    # UPDATE of this worker's rows does (else the two can deadlock)
    ids = sorted({i for i, _ in started} | {o.job_id for o in ending})
    lock = db.stmt("finish.swap_lock", lambda: db.ops.for_update(
        select(J.c.id).where(db.ops.in_ids_param(J.c.id, "ids")).order_by(J.c.id)))
    for part in chunks(ids):
        await conn.execute(lock, {"ids": part})
    stmt = db.stmt("finish.swap_in", lambda: update(J).where(
        db.ops.in_ids_param(J.c.id, "ids"), J.c.state == lit(S.LEASED),
        J.c.attempts == bindparam("a"), J.c.lease_owner == bindparam("o"),
    ).values(state=S.RUNNING, started_at=db_now(),
             lease_expires=utcnow_plus(s.lease_ttl)))
    by: dict[int, list[int]] = defaultdict(list)
    for jid, attempt in started:
        by[attempt].append(jid)
    for attempt, ids in sorted(by.items()):
        ids.sort()
        for part in chunks(ids):
            await conn.execute(stmt, {"ids": part, "a": attempt,
                                      "o": s.worker_id})

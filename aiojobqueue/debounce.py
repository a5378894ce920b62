"""Debounce: ``enqueue(..., key=k, debounce=timedelta(seconds=30), debounce_max=...)``
coalesces a burst of enqueues into one run.

The first enqueue of the burst inserts the keyed job with ``run_after`` = now + debounce.
While it has not started (``waiting``, ``scheduled`` or ``ready``), each later enqueue
with the key locks its row, replaces its args and moves its ``run_after`` to now +
debounce, never past its first enqueue (``created_at``) + ``debounce_max``; it returns
the same id. Once the job has started, the key is an ordinary uniqueness key: an enqueue
returns the live job's id and changes nothing (its burst has been served).

Races: the row is locked before it is read (a claim skips a locked row, and one that
leased it first makes the row ``leased``/``running``, which the update leaves alone);
``live_key`` is unique among live jobs, so racing first enqueues insert one row, and the
losers (their insert found the winner's row) apply their args to it in the same way. So a
burst never yields two runs, whatever the number of processes enqueueing. Times are the
database's (``db_now``), never a client's clock."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .errors import InvalidJobError
from .timeutil import as_utc, db_now

if TYPE_CHECKING:
    from .handlers import Handler
    from .queue import JobQueue

#: the states in which a debounced job has not started: its burst is still open
OPEN = (S.WAITING, S.SCHEDULED, S.READY)


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value < 0):
        raise InvalidJobError(f"{what} must be a timedelta or seconds >= 0: {value!r}")
    return float(value)


def check(key: str | None, debounce: Any, debounce_max: Any, run_after: Any
          ) -> tuple[float, float | None]:
    """(debounce, debounce_max) in seconds, or InvalidJobError (nothing written)."""
    if key is None:
        raise InvalidJobError("debounce needs a key (the burst is the enqueues with one key)")
    if run_after is not None:
        raise InvalidJobError("debounce sets run_after itself: give one or the other")
    d = _seconds(debounce, "debounce")
    m = None if debounce_max is None else _seconds(debounce_max, "debounce_max")
    return d, m


async def enqueue(q: JobQueue, type: str | Handler[..., Any], args: dict[str, Any] | None,
                  key: str | None, debounce: Any, debounce_max: Any,
                  options: dict[str, Any]) -> int:
    """``JobQueue.enqueue`` with ``debounce`` (see the module docstring)."""
    d, m = check(key, debounce, debounce_max, options.pop("run_after", None))
    assert key is not None
    b = q.batch()  # checks type, args and options before anything is written
    first = d if m is None else min(d, m)
    ref = b.add(type, args, key=key, run_after=timedelta(seconds=first), **options)
    values = {} if args is None else args
    push = partial(_push, q, key, ref.type, values, d, m)
    got = await q._write(push)
    if got is not None:
        return got
    await b.commit()
    # Another process may have inserted the key first (our insert then found its row):
    # our args must still win. Where the row is ours, this rewrites what it holds.
    again = await q._write(push)
    return ref.id if again is None else again


async def _push(q: JobQueue, key: str, type: str, args: dict[str, Any], d: float,
                m: float | None, conn: AsyncConnection) -> int | None:
    """Lock the live job with ``key``; if it has not started (and is of ``type``), give it
    ``args`` and push its run_after. Returns its id, or None where no job has the key."""
    J = q._t.jobs
    db = q._started().db
    row = (await conn.execute(db.ops.for_update(
        select(J.c.id, J.c.type, J.c.state, J.c.created_at, db_now().label("now"))
        .where(J.c.live_key == key)))).first()
    if row is None:
        return None
    if row.state not in OPEN or row.type != type:
        return int(row.id)  # started (or another type's key): the key dedups as usual
    now: datetime = as_utc(row.now)
    at = now + timedelta(seconds=d)
    if m is not None:
        at = min(at, as_utc(row.created_at) + timedelta(seconds=m))
    state = row.state if row.state == S.WAITING else S.READY if at <= now else S.SCHEDULED
    await conn.execute(update(J).where(J.c.id == row.id).values(
        args=args, run_after=at, state=state))
    if state == S.READY:
        await db.ops.notify(conn)
    return int(row.id)

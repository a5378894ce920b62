"""Periodic jobs: a schedule that enqueues exactly one job per slot across every worker.

Every worker that serves a queue with schedules runs one side loop (``run_schedules``). For
each schedule it enqueues the NEXT slot ahead of time, as a job with ``run_after=slot``, in
one transaction that also moves the schedule's high-water mark in the ``meta`` table
(``cron:<name>`` = the last slot enqueued). The mark is read under a row lock (the write lock
on SQLite), so of several workers racing for one slot exactly one enqueues it, and a slot
whose job already FINISHED is never enqueued again (a uniqueness ``key`` alone would allow
that: keys are unique only among live jobs). The job also carries
``key="cron:<name>:<slot ISO>"`` as a second guard.

Slot times come from the database clock, so workers on several hosts agree. Because a slot is
enqueued one period early, a worker that wakes late still enqueues it in time; a slot that
came and went while NO worker was serving is skipped (no backfill, like cron).
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from .batch import check_json
from .errors import ConfigurationError
from .timeutil import db_now

if TYPE_CHECKING:
    from .batch import Batch
    from .database import Database

#: makes a batch that inserts on the given connection (``JobQueue.batch(connection=)``)
BatchOn = Callable[[AsyncConnection], "Batch"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: Longest sleep between looks at the schedules (a new slot is enqueued one period early).
MAX_SLEEP = 60.0


@dataclass(frozen=True)
class Schedule:
    """One registered periodic job: ``every`` seconds (epoch-aligned) or a ``cron`` string."""

    name: str
    type: str
    args: dict[str, Any]
    every: float | None = None
    cron: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def next_after(self, t: datetime) -> datetime:
        """The first slot strictly after ``t`` (UTC)."""
        if self.every is not None:
            secs = (t - _EPOCH).total_seconds()
            n = math.floor(secs / self.every) + 1
            return _EPOCH + timedelta(seconds=n * self.every)
        from croniter import croniter

        assert self.cron is not None
        nxt = croniter(self.cron, t.astimezone(UTC)).get_next(datetime)
        assert isinstance(nxt, datetime)
        return nxt if nxt.tzinfo else nxt.replace(tzinfo=UTC)

    def key(self, slot: datetime) -> str:
        return f"cron:{self.name}:{slot_iso(slot)}"


def slot_iso(slot: datetime) -> str:
    """A fixed-width UTC ISO string: sorts as time does, so the mark compares as text."""
    return slot.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_OPTIONS = {"group", "weight", "priority", "timeout", "max_attempts"}


def make_schedule(
    name: str,
    *,
    type: str,
    args: dict[str, Any] | None = None,
    every: timedelta | float | None = None,
    cron: str | None = None,
    **options: Any,
) -> Schedule:
    """Validate and build a Schedule (see ``JobQueue.periodic``)."""
    if not isinstance(name, str) or not name or len(name) > 50 or ":" in name:
        raise ConfigurationError(f"schedule name must be 1-50 chars without ':': {name!r}")
    if not isinstance(type, str) or not type:
        raise ConfigurationError(f"schedule {name!r}: type must be a job type name: {type!r}")
    if (every is None) == (cron is None):
        raise ConfigurationError(f"schedule {name!r}: give exactly one of every= or cron=")
    unknown = set(options) - _OPTIONS
    if unknown:
        raise ConfigurationError(f"schedule {name!r}: unknown options {sorted(unknown)}")
    args = {} if args is None else args
    if not isinstance(args, dict):
        raise ConfigurationError(f"schedule {name!r}: args must be a dict")
    check_json(args, f"args of schedule {name!r}")
    secs: float | None = None
    if every is not None:
        secs = every.total_seconds() if isinstance(every, timedelta) else float(every)
        if not math.isfinite(secs) or secs < 0.1:
            raise ConfigurationError(f"schedule {name!r}: every must be >= 0.1 s: {every!r}")
    if cron is not None:
        from croniter import croniter

        if not isinstance(cron, str) or not croniter.is_valid(cron):
            raise ConfigurationError(f"schedule {name!r}: not a cron expression: {cron!r}")
    return Schedule(name, type, dict(args), secs, cron, dict(options))


async def enqueue_slot(
    db: Database, batch_on: BatchOn, conn: AsyncConnection, *, s: Schedule, slot: datetime
) -> int | None:
    """In the caller's write transaction: enqueue ``slot`` of ``s`` unless it (or a later
    slot) was already enqueued. Returns the new job id, or None."""
    M = db.t.meta
    mark = f"cron:{s.name}"
    await db.ops.insert_ignore(conn, M, [{"name": mark, "value": ""}])
    last = (await conn.execute(
        db.ops.for_update(select(M.c.value).where(M.c.name == mark))
    )).scalar_one()
    iso = slot_iso(slot)
    if last and last >= iso:
        return None
    b = batch_on(conn)
    ref = b.add(s.type, s.args, run_after=slot, key=s.key(slot), **s.options)
    await b.commit()
    await conn.execute(update(M).where(M.c.name == mark).values(value=iso))
    return ref.id


async def run_schedules(db: Database, schedules: Mapping[str, Schedule],
                        batch_on: BatchOn) -> None:
    """The side loop: keep each schedule's next slot enqueued; sleep until a slot passes."""
    todo = list(schedules.values())
    if not todo:
        return
    while True:
        now: datetime = await db.read(_db_time)
        soonest = now + timedelta(seconds=MAX_SLEEP)
        for s in todo:
            slot = s.next_after(now)
            await db.write(functools.partial(enqueue_slot, db, batch_on, s=s, slot=slot))
            soonest = min(soonest, slot)
        # wake just after the soonest slot, when the slot after it becomes the one to enqueue
        await asyncio.sleep(max((soonest - now).total_seconds(), 0.0) + 0.01)


async def _db_time(conn: AsyncConnection) -> datetime:
    t = (await conn.execute(select(db_now()))).scalar_one()
    assert isinstance(t, datetime)
    return t

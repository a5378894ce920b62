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

v10: schedules are rows (aiojobqueue.schedules): the mark is the row's ``last_slot``, and
an operator can pause a schedule there (no slot is enqueued while ``paused``, checked under
the same row lock). A ``cron`` may be read in a time zone (``tz``): slots are wall-clock
times there, a wall time that does not exist (the spring-forward gap) is skipped, and one
that happens twice (the fall-back hour) runs once, at its first occurrence. The loop reads
its clock from the database unless given one (``clock``: tests cross a daylight-saving
change with a clock they set).
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

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
#: the time now, as an aware datetime (JobQueue.schedule_clock; default: the database's)
Clock = Callable[[], Awaitable[datetime]]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: Longest sleep between looks at the schedules (a new slot is enqueued one period early).
MAX_SLEEP = 60.0


@dataclass(frozen=True)
class Schedule:
    """One registered periodic job: ``every`` seconds (epoch-aligned) or a ``cron`` string,
    read in the time zone ``tz`` (an IANA name; None: UTC)."""

    name: str
    type: str
    args: dict[str, Any]
    every: float | None = None
    cron: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    tz: str | None = None

    def next_after(self, t: datetime) -> datetime:
        """The first slot strictly after ``t`` (UTC)."""
        if self.every is not None:
            secs = (t - _EPOCH).total_seconds()
            n = math.floor(secs / self.every) + 1
            return _EPOCH + timedelta(seconds=n * self.every)
        from croniter import croniter

        assert self.cron is not None
        if self.tz is None:
            nxt = croniter(self.cron, t.astimezone(UTC)).get_next(datetime)
            assert isinstance(nxt, datetime)
            return nxt if nxt.tzinfo else nxt.replace(tzinfo=UTC)
        return _next_in_zone(self.cron, ZoneInfo(self.tz), t)

    def describe(self) -> str:
        """``every 5 s`` or ``cron */30 * * * *`` (the zone is shown apart)."""
        return f"every {self.every:g} s" if self.every is not None else f"cron {self.cron}"

    def key(self, slot: datetime) -> str:
        return f"cron:{self.name}:{slot_iso(slot)}"


#: wall-clock candidates looked at before giving up (a cron that matches only inside gaps)
_MAX_CANDIDATES = 10_000


def _next_in_zone(cron: str, zone: ZoneInfo, t: datetime) -> datetime:
    """The first slot after ``t`` of ``cron`` read as wall-clock time in ``zone``.

    croniter walks naive wall times (it knows no zone, so no transition can confuse it);
    each candidate is then placed in the zone: one in a gap (it reads back as another wall
    time) does not exist and is skipped; one in a fold is taken at its first occurrence
    (``fold=0``), so the repeat, whose wall time is the same, is never a slot of its own.
    The walk starts from ``t``'s wall time minus the largest offset jump, so that a ``t``
    in the second pass of a fold still finds the slots after it."""
    from croniter import croniter

    start = t.astimezone(zone).replace(tzinfo=None) - timedelta(hours=3)
    it = croniter(cron, start)
    for _ in range(_MAX_CANDIDATES):
        wall = it.get_next(datetime)
        assert isinstance(wall, datetime)
        local = wall.replace(tzinfo=zone)  # fold=0: the first occurrence of a repeated time
        utc = local.astimezone(UTC)
        if utc.astimezone(zone).replace(tzinfo=None) != wall:
            continue  # in a gap: this wall time never happens that day
        if utc > t:
            return utc
    raise ConfigurationError(f"cron {cron!r} in {zone.key} has no slot after {t.isoformat()}")


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
    tz: str | None = None,
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
    check_tz(name, tz, cron)
    return Schedule(name, type, dict(args), secs, cron, dict(options), tz)


def check_tz(name: str, tz: str | None, cron: str | None) -> None:
    """ConfigurationError unless ``tz`` is None or an IANA zone given with a ``cron``."""
    if tz is None:
        return
    if cron is None:
        raise ConfigurationError(f"schedule {name!r}: tz= applies to cron= (every= slots are "
                                 "aligned to the Unix epoch, whatever the zone)")
    if not isinstance(tz, str) or not tz or len(tz) > 64:
        raise ConfigurationError(f"schedule {name!r}: tz must be an IANA zone name: {tz!r}")
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigurationError(
            f"schedule {name!r}: unknown time zone {tz!r} (an IANA name such as "
            "'Europe/Paris')") from None


def spec_of(s: Schedule) -> dict[str, Any]:
    """The columns of ``s``'s row that its code declares (aiojobqueue.schedules.declare)."""
    return {"type": s.type, "cron": s.cron, "every": s.every, "tz": s.tz,
            "args": s.args, "options": s.options}


def schedule_of(name: str, row: Any) -> Schedule | None:
    """The Schedule a row declares, or None for a row no worker has declared yet (a mark
    carried over from v9) or one whose spec this version cannot read."""
    if not row.type or (row.cron is None) == (row.every is None):
        return None
    try:
        return make_schedule(name, type=row.type, args=row.args or {}, every=row.every,
                             cron=row.cron, tz=row.tz, **(row.options or {}))
    except Exception:  # a row written by a newer version: not ours to run
        return None


async def enqueue_slot(
    db: Database, batch_on: BatchOn, conn: AsyncConnection, *, s: Schedule, slot: datetime
) -> int | None:
    """In the caller's write transaction: enqueue ``slot`` of ``s`` unless it (or a later
    slot) was already enqueued, or the schedule is paused. Returns the new job id, or None.

    The schedule's row is read under its row lock (the write lock on SQLite), so of several
    workers racing for one slot exactly one enqueues it; a row missing (a schedule enqueued
    before any declaration) is made from ``s``."""
    T = db.t.schedules
    await db.ops.insert_ignore(conn, T, [{"name": s.name, **spec_of(s)}])
    row = (await conn.execute(db.ops.for_update(
        select(T.c.last_slot, T.c.paused).where(T.c.name == s.name)))).one()
    iso = slot_iso(slot)
    if row.paused or (row.last_slot and row.last_slot >= iso):
        return None
    b = batch_on(conn)
    ref = b.add(s.type, s.args, run_after=slot, key=s.key(slot), **s.options)
    await b.commit()
    await conn.execute(update(T).where(T.c.name == s.name).values(last_slot=iso))
    return ref.id


async def run_schedules(db: Database, schedules: Mapping[str, Schedule], batch_on: BatchOn,
                        *, clock: Clock | None = None, poll: float = MAX_SLEEP) -> None:
    """The side loop: keep each schedule's next slot enqueued; sleep until a slot passes or
    ``poll`` seconds (a pause, resume or new spec in the rows is seen within that).

    Runs the schedules this process declared (by name), as their rows say now; one read of
    the rows per turn, a write only where a slot is due to be enqueued."""
    names = list(schedules)
    if not names:
        return
    T = db.t.schedules
    now_of = clock or functools.partial(db.read, _db_time)
    while True:
        now = await now_of()
        rows = {r.name: r for r in await db.read(
            lambda c: _rows(c, T, names))}
        soonest = now + timedelta(seconds=MAX_SLEEP)
        for name, code in schedules.items():
            row = rows.get(name)
            s = (schedule_of(name, row) if row is not None else None) or code
            if row is not None and row.paused:
                continue
            slot = s.next_after(now)
            soonest = min(soonest, slot)
            if row is not None and row.last_slot and row.last_slot >= slot_iso(slot):
                continue  # already enqueued: no write (and no row lock) this turn
            await db.write(functools.partial(enqueue_slot, db, batch_on, s=s, slot=slot))
        # wake just after the soonest slot, when the slot after it becomes the one to enqueue
        wait = max((soonest - now).total_seconds(), 0.0) + 0.01
        await asyncio.sleep(min(wait, poll))


async def _rows(conn: AsyncConnection, T: Any, names: list[str]) -> list[Any]:
    return list((await conn.execute(select(T).where(T.c.name.in_(names)))).all())


async def _db_time(conn: AsyncConnection) -> datetime:
    t = (await conn.execute(select(db_now()))).scalar_one()
    assert isinstance(t, datetime)
    return t

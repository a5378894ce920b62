"""Schedules as rows: what the code declares, and what an operator does to them.

Each ``queue.periodic(...)`` is declared into the ``schedules`` table when the queue starts
(``declare``): the spec columns are written where they differ from what is stored, with
the old and the new value logged; ``paused`` and the last slot are the operator's and the
loop's, never touched by a declaration. Every worker then enqueues from the row
(aiojobqueue.periodic), so ``pause`` / ``resume`` / ``trigger`` made here, from any process,
reach every worker: a pause is checked under the row lock each slot is enqueued under, a
resume is seen at the loop's next look (``poll_interval``).

Pausing also cancels the slot already enqueued ahead (the loop enqueues one period early)
if it has not started, and moves the mark back before it, so a resume before that slot
still runs it; slots that pass while paused are skipped (no backfill), as with cron.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .errors import InvalidStateError, ScheduleNotFoundError
from .periodic import BatchOn, Clock, Schedule, schedule_of, slot_iso, spec_of
from .timeutil import db_now

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .core import Core
    from .database import Database

log = logging.getLogger("aiojobqueue")


@dataclass(frozen=True)
class ScheduleInfo:
    """One row of ``aiojobqueue schedules`` / ``JobQueue.schedules()``.

    ``last_slot``: the last slot enqueued (usually still to come: a slot is enqueued one
    period early); ``next_slot``: when its next job is due (None while paused, or for a
    row no worker declared yet); ``last_state``: the state of the last slot's job
    (``finished`` once it was deleted or ended, None when there is none)."""

    name: str
    type: str | None
    period: str | None
    tz: str | None
    paused: bool
    last_slot: datetime | None
    next_slot: datetime | None
    last_state: str | None


def _parse(iso: str) -> datetime | None:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")) if iso else None


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name or len(name) > 50 or ":" in name:
        raise ScheduleNotFoundError(f"no schedule named {name!r}")
    return name


async def on_start(core: Core, clock: Clock | None, *, declare: bool) -> None:
    """What JobQueue.start does for schedules: set the clock, and (``declare``: a start
    that may write) declare the code's schedules."""
    core.schedule_clock = clock
    if declare and core.schedules:
        await declare_all(core.db, core.schedules)


async def declare_all(db: Database, schedules: Mapping[str, Schedule]) -> list[str]:
    """Write each schedule's spec into its row where it differs (one transaction); returns
    the names written. Logged: a new row at INFO, a changed one with old and new values."""
    T = db.t.schedules

    async def go(conn: AsyncConnection) -> list[str]:
        rows = {r.name: r for r in (await conn.execute(db.ops.for_update(
            select(T).where(T.c.name.in_(list(schedules)))))).all()}
        written = []
        now = (await conn.execute(select(db_now()))).scalar_one()
        for name, s in schedules.items():
            spec = spec_of(s)
            row = rows.get(name)
            if row is None:
                await db.ops.insert_ignore(conn, T, [{"name": name, **spec,
                                                      "declared_at": now}])
                log.info("schedule %s declared: %s", name, spec)
            else:
                old = {k: getattr(row, k) for k in spec}
                if old == spec:
                    continue
                await conn.execute(update(T).where(T.c.name == name).values(
                    **spec, declared_at=now))
                changed = {k: (old[k], v) for k, v in spec.items() if old[k] != v}
                log.warning("schedule %s changed by this declaration (old, new): %s",
                            name, changed)
            written.append(name)
        return written

    return await db.write(go)


async def list_schedules(db: Database) -> list[ScheduleInfo]:
    """Every row, by name, with its last and next slot (the database's clock)."""
    T, J = db.t.schedules, db.t.jobs

    async def go(conn: AsyncConnection) -> list[ScheduleInfo]:
        now = (await conn.execute(select(db_now()))).scalar_one()
        out = []
        for r in (await conn.execute(select(T).order_by(T.c.name))).all():
            s = schedule_of(r.name, r)
            last = _parse(r.last_slot)
            state = None
            if last is not None:
                # a live slot job is one probe of the unique live_key index
                state = await conn.scalar(select(J.c.state).where(
                    J.c.live_key == f"cron:{r.name}:{r.last_slot}")) or "finished"
            nxt = None
            if s is not None and not r.paused:
                nxt = last if last is not None and last > now else s.next_after(now)
            out.append(ScheduleInfo(r.name, r.type or None, s.describe() if s else None,
                                    r.tz, bool(r.paused), last, nxt, state))
        return out

    return await db.read(go)


async def pause(core: Core, name: str) -> bool:
    """Pause a schedule: no worker enqueues its slots until ``resume``; the slot already
    enqueued ahead is cancelled unless it started. Returns False if it was paused already."""
    db, T, J = core.db, core.db.t.schedules, core.db.t.jobs
    _check_name(name)

    async def go(conn: AsyncConnection) -> bool:
        row = await _locked(conn, db, name)
        if row.paused:
            return False
        values: dict[str, Any] = {"paused": True}
        if row.last_slot:
            ahead = (await conn.execute(select(J.c.id).where(
                J.c.live_key == f"cron:{name}:{row.last_slot}",
                J.c.state == S.SCHEDULED))).scalar()
            if ahead is not None and await core.actions.cancel(conn, ahead) == S.CANCELLED:
                # before that slot: a resume in time enqueues it again
                slot = _parse(row.last_slot)
                assert slot is not None
                values["last_slot"] = slot_iso(slot - timedelta(microseconds=1))
        await conn.execute(update(T).where(T.c.name == name).values(**values))
        return True

    return await db.write(go)


async def resume(db: Database, name: str) -> bool:
    """Resume a paused schedule (from its next slot after now: no backfill). Returns False
    if it was not paused."""
    T = db.t.schedules
    _check_name(name)

    async def go(conn: AsyncConnection) -> bool:
        row = await _locked(conn, db, name)
        if not row.paused:
            return False
        await conn.execute(update(T).where(T.c.name == name).values(paused=False))
        return True

    return await db.write(go)


async def trigger(db: Database, batch_on: BatchOn, name: str) -> int:
    """Enqueue one job of the schedule now, outside its slots (paused or not); the slots
    and the mark are left alone. Returns the job id."""
    _check_name(name)

    async def go(conn: AsyncConnection) -> int:
        row = await _locked(conn, db, name)
        s = schedule_of(name, row)
        if s is None:
            raise InvalidStateError(f"schedule {name!r} has no declaration yet: a worker "
                                    "whose code registers it declares it when it starts")
        now = (await conn.execute(select(db_now()))).scalar_one()
        b = batch_on(conn)
        ref = b.add(s.type, s.args, key=f"cron:{name}:now:{slot_iso(now)}", **s.options)
        await b.commit()
        return ref.id

    return await db.write(go)


async def _locked(conn: AsyncConnection, db: Database, name: str) -> Any:
    T = db.t.schedules
    row = (await conn.execute(db.ops.for_update(select(T).where(T.c.name == name)))).first()
    if row is None:
        raise ScheduleNotFoundError(f"no schedule named {name!r}")
    return row


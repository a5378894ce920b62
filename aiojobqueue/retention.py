"""Retention: finished DAGs are deleted once they are older than the retention of their
state, by one worker at a time, in small batches.

``JobQueue(retention={"done": timedelta(days=7), "failed": timedelta(days=30)})`` declares
it; it is stored in the database (the ``sweeps`` row ``retention``) at start where it
differs, so every worker on the database sweeps by the same rule, also one started without
it. A state left out is kept for ever. ``read_retention`` / ``write_retention`` are the
storage, for the stored policy and the tools.

Every serving worker runs ``Sweeper.run``: every ``EVERY`` seconds it tries to take the
sweep's lease (a conditional UPDATE of that row: free, expired or already its own); the
holder deletes (see sweep.py for what goes and what stays) and renews the lease in each
batch's transaction, so a batch commits only while its sweeper still holds the lease, and a
SIGKILLed sweeper is replaced once its lease (``TTL``) expires. The row also keeps what the
last sweep did, for the dashboard.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy import insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .errors import ConfigurationError
from .sweep import sweep
from .timeutil import db_now, utcnow_plus

if TYPE_CHECKING:
    from .database import Database

log = logging.getLogger("aiojobqueue.retention")

NAME = "retention"
#: Seconds between a worker's attempts to sweep (each with up to 20% jitter).
EVERY = 60.0
#: Seconds a sweeper's lease lasts without a renewal (each batch renews it).
TTL = 30.0
#: The most top-level jobs one batch looks at (its components may add more rows).
BATCH = 500
#: Seconds to pause between batches, so a sweep never takes the database for itself.
PAUSE = 0.05


def check_retention(retention: Mapping[str, Any]) -> dict[str, timedelta]:
    """``{"done"|"failed"|"cancelled": timedelta}``; raises ConfigurationError."""
    if not isinstance(retention, Mapping):
        raise ConfigurationError(f"retention must be a mapping of state to timedelta: "
                                 f"{retention!r}")
    out: dict[str, timedelta] = {}
    for state, age in retention.items():
        if state not in S.TERMINAL:
            raise ConfigurationError(f"retention is per terminal state ({', '.join(S.TERMINAL)}),"
                                     f" not {state!r}")
        if isinstance(age, (int, float)) and not isinstance(age, bool):
            age = timedelta(seconds=age)
        if not isinstance(age, timedelta) or age < timedelta(0):
            raise ConfigurationError(f"retention of {state!r} must be a timedelta >= 0: {age!r}")
        out[state] = age
    return out


def _encode(r: Mapping[str, timedelta]) -> dict[str, float]:
    return {k: r[k].total_seconds() for k in sorted(r)}


async def read_retention(db: Database) -> dict[str, timedelta]:
    """The retention stored in the database (empty: none; nothing is deleted)."""
    X = db.t.sweeps

    async def read(conn: AsyncConnection) -> Any:
        return await conn.scalar(select(X.c.policy).where(X.c.name == NAME))

    stored = await db.read(read)
    return {k: timedelta(seconds=float(v)) for k, v in (stored or {}).items()}


async def write_retention(db: Database, retention: Mapping[str, Any]) -> bool:
    """Store ``retention`` (checked: ConfigurationError) for every worker on the database;
    returns whether it changed. An empty mapping turns retention off."""
    want = _encode(check_retention(retention))
    X = db.t.sweeps

    async def write(conn: AsyncConnection) -> bool:
        old = await conn.execute(db.ops.for_update(
            select(X.c.policy).where(X.c.name == NAME)))
        row = old.first()
        if row is None:
            await conn.execute(insert(X).values(name=NAME, policy=want))
            return True
        if (row.policy or {}) == want:
            return False
        await conn.execute(update(X).where(X.c.name == NAME).values(policy=want))
        return True

    try:
        return await db.write(write)
    except IntegrityError:  # another worker inserted the row first: compare with its
        return await db.write(write)


async def declare(db: Database, retention: Mapping[str, timedelta]) -> None:
    """At start: store the retention this queue was built with where it differs (logged)."""
    if await write_retention(db, retention):
        log.info("retention now %s", {k: str(v) for k, v in retention.items()} or "off")


@dataclass
class LastSweep:
    """The retention in force and what the last sweep did (for the dashboard)."""

    retention: dict[str, timedelta]
    owner: str | None
    started: datetime | None
    finished: datetime | None
    deleted: int
    total: int


async def last_sweep(db: Database) -> LastSweep | None:
    """The sweeps row, or None when no retention was ever stored."""
    X = db.t.sweeps

    async def read(conn: AsyncConnection) -> Any:
        return (await conn.execute(select(X).where(X.c.name == NAME))).first()

    r = await db.read(read)
    if r is None:
        return None
    pol = {k: timedelta(seconds=float(v)) for k, v in (r.policy or {}).items()}
    return LastSweep(pol, r.lease_owner, r.last_started, r.last_finished,
                     int(r.last_deleted), int(r.total_deleted))


class Sweeper:
    """One worker's side loop: take the lease when it is free, then sweep (sweep.py)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.me = db.worker_id

    async def run(self) -> None:
        """Forever: wait, try the lease, sweep while holding it."""
        while True:
            await asyncio.sleep(EVERY * (0.8 + 0.4 * random.random()))
            policy = await read_retention(self.db)
            if not policy or not await self.db.write(self.acquire):
                continue
            n = await sweep(self.db, policy, self.renew, BATCH, PAUSE)
            await self.db.write(partial(self.release, deleted=n))

    async def acquire(self, conn: AsyncConnection) -> bool:
        """Take the lease if free, expired or ours (one statement: the row lock decides)."""
        X = self.db.t.sweeps
        res = await conn.execute(update(X).where(
            X.c.name == NAME,
            or_(X.c.lease_owner.is_(None), X.c.lease_owner == self.me,
                X.c.lease_expires < db_now()),
        ).values(lease_owner=self.me, lease_expires=utcnow_plus(TTL), last_started=db_now()))
        return int(res.rowcount) == 1

    async def renew(self, conn: AsyncConnection) -> bool:
        """Inside a batch's transaction: extend the lease if still ours. False: another
        sweeper took over (this one's lease expired), so the batch must not commit."""
        X = self.db.t.sweeps
        res = await conn.execute(update(X).where(
            X.c.name == NAME, X.c.lease_owner == self.me,
        ).values(lease_expires=utcnow_plus(TTL)))
        return int(res.rowcount) == 1

    async def release(self, conn: AsyncConnection, *, deleted: int) -> None:
        """Record the sweep and free the lease (if still ours)."""
        X = self.db.t.sweeps
        await conn.execute(update(X).where(X.c.name == NAME, X.c.lease_owner == self.me).values(
            lease_owner=None, lease_expires=None, last_finished=db_now(), last_deleted=deleted,
            total_deleted=X.c.total_deleted + deleted))

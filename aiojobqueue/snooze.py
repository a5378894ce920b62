"""Snooze: a handler that raises ``Snooze(seconds)`` puts its job back to ``scheduled`` for
that long without using an attempt (``Job.snoozes`` counts them), e.g. on a 429 with a
``Retry-After``. The outcome is written by the fenced finalize (finalize.py), so it
takes effect only while the attempt still holds its lease, and a cancel requested while it
ran wins."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .database import Database
from .errors import AioJobQueueError, InvalidJobError
from .timeutil import utcnow_plus

#: the longest snooze: a year (a longer one is almost surely a unit mistake)
MAX_SECONDS = 366 * 86400.0


class Snooze(AioJobQueueError):
    """Raise from a handler to run the job again after ``seconds`` (a number or a
    timedelta), without using an attempt. Bad input: InvalidJobError at construction."""

    def __init__(self, seconds: float | timedelta) -> None:
        if isinstance(seconds, timedelta):
            seconds = seconds.total_seconds()
        if (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                or not math.isfinite(seconds) or not 0 <= seconds <= MAX_SECONDS):
            raise InvalidJobError(
                f"Snooze takes 0 to {MAX_SECONDS:.0f} seconds (or a timedelta): {seconds!r}")
        self.seconds = float(seconds)
        super().__init__(f"snoozed for {self.seconds}s")


async def write(db: Database, conn: AsyncConnection, job_id: int, seconds: float) -> None:
    """Put the leased job ``job_id`` (locked by the caller's fenced finalize) back to
    ``scheduled`` in ``seconds``: one more attempt allowed (the claim counted one), one
    more snooze counted, the lease cleared."""
    J = db.t.jobs
    values: dict[str, Any] = {
        "state": S.SCHEDULED, "run_after": utcnow_plus(seconds),
        "attempt_limit": J.c.attempt_limit + 1, "snoozes": J.c.snoozes + 1,
        "lease_owner": None, "lease_expires": None,
    }
    await conn.execute(update(J).where(J.c.id == job_id).values(**values))

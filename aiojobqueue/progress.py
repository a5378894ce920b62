"""``ctx.progress(done, total, message)``: a running handler's progress, saved coalesced.

A handler may report progress thousands of times a second; the database sees at most one
write per ``INTERVAL`` seconds per attempt. A report that comes within the interval of the
last write is held, and written when the interval ends (by a timer) or before the attempt's
outcome is written, whichever comes first, so the last value always lands before the
finalize. Every write is fenced like ``ctx.checkpoint()``: it changes the row only while
this attempt holds its lease, and a report after a fenced-out write raises LeaseLostError.
Progress is best-effort: a database that is away or locked never fails the job nor holds
its handler up (see ``Reporter``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import update

from . import schema as S
from .besteffort import Throttle
from .errors import InvalidJobError, LeaseLostError
from .logs import brief
from .sql import lit

if TYPE_CHECKING:
    from .claimed import Claimed
    from .database import Database

log = logging.getLogger("aiojobqueue.progress")

#: At most one progress write per attempt per this many seconds.
INTERVAL = 1.0
#: Longer messages are cut to this many characters.
MAX_MESSAGE = 1000
#: The longest a report waits for its write's answer (a lost lease raises at that report).
PATIENCE = 0.5
#: While the database refuses progress writes, the pause between tries doubles up to this.
MAX_PAUSE = 10.0
#: Conflict retries of one progress write (an outage is not retried: the next report is).
WRITE_RETRIES = 2
#: Failed progress writes are logged at most once per this many seconds per process.
WARNINGS = Throttle(every=5.0)


def value(done: Any, total: Any = None, message: Any = None) -> dict[str, Any]:
    """The stored form of one report; raises InvalidJobError for anything else."""
    for name, n in (("done", done), ("total", total)):
        if n is None and name == "total":
            continue
        if isinstance(n, bool) or not isinstance(n, (int, float)) or not math.isfinite(n):
            raise InvalidJobError(f"progress {name} must be a finite number, got {n!r}")
        if n < 0:
            raise InvalidJobError(f"progress {name} must be >= 0, got {n!r}")
    if message is not None and not isinstance(message, str):
        raise InvalidJobError(f"progress message must be a str or None, got {message!r}")
    return {"done": done, "total": total,
            "message": None if message is None else message[:MAX_MESSAGE],
            "at": datetime.now(UTC).isoformat()}


def snapshot(stored: Any) -> dict[str, Any] | None:
    """``Job.progress`` from the stored column (``at`` as an aware datetime)."""
    if not isinstance(stored, dict):
        return None
    at = stored.get("at")
    when = datetime.fromisoformat(at) if isinstance(at, str) else None
    if when is not None and when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return {"done": stored.get("done"), "total": stored.get("total"),
            "message": stored.get("message"), "at": when}


class Reporter:
    """The coalescer of one attempt (made on its first report).

    Progress is best-effort: a write the database refuses (an outage, a locked SQLite file)
    is logged (at most once per ``WARN_EVERY`` seconds per process), kept pending and tried
    again after a growing pause; the handler never sees it and never waits on it longer than
    ``PATIENCE``. Only a lost lease (the fence) and a bad value reach the handler."""

    def __init__(self, db: Database, worker_id: str, c: Claimed) -> None:
        self._db = db
        self._me = worker_id
        self._c = c
        self._pending: dict[str, Any] | None = None
        self._written_at = -math.inf  # monotonic time of the last write (or of the next try)
        self._timer: asyncio.Task[None] | None = None  # the write scheduled or in flight
        self._lock = asyncio.Lock()
        self._lost = False
        self._pause = INTERVAL  # between tries while the database refuses writes
        #: writes made, for tests and curiosity
        self.writes = 0

    async def report(self, done: Any, total: Any, message: Any) -> None:
        v = value(done, total, message)
        if self._lost:
            raise self._lost_error()
        self._pending = v
        if self._timer is not None:
            return  # the scheduled (or running) write takes the latest value
        wait = self._written_at + INTERVAL - time.monotonic()
        timer = self._timer = asyncio.get_running_loop().create_task(self._later(wait))
        if wait <= 0:
            # wait briefly for the answer so a lost lease raises here, at this report; a
            # slow database (an outage, a locked file) does not hold the handler up
            await asyncio.wait({timer}, timeout=PATIENCE)
            if self._lost:
                raise self._lost_error()

    async def _later(self, delay: float) -> None:
        try:
            if delay > 0:
                await asyncio.sleep(delay)
            await self._write()
            self._pause = INTERVAL
        except Exception as exc:  # the handler learns of a lost lease at its next report
            if not self._lost:
                self._refused(exc)
        finally:
            self._timer = None

    def _refused(self, exc: Exception) -> None:
        """A write the database refused: keep the value, try again later, warn (throttled)."""
        self._written_at = time.monotonic() + self._pause - INTERVAL
        self._pause = min(self._pause * 2, MAX_PAUSE)
        if WARNINGS.due():
            log.warning("job %s: progress not saved (%s); the job goes on, the next report "
                        "retries%s", self._c.id, brief(exc), WARNINGS.suppressed_text())

    async def _write(self) -> None:
        async with self._lock:
            v = self._pending
            if v is None:
                return
            self._written_at = time.monotonic()
            if await self._db.write(self._fenced(v), retries=WRITE_RETRIES) != 1:
                self._lost = True
                raise self._lost_error()
            self.writes += 1
            if self._pending is v:  # (a write cut short keeps it pending: close() writes it)
                self._pending = None

    def _fenced(self, v: dict[str, Any]) -> Any:
        J, c, me = self._db.t.jobs, self._c, self._me

        async def write(conn: Any) -> int:
            res = await conn.execute(
                update(J).where(J.c.id == c.id, J.c.attempts == c.attempt,
                                J.c.state.in_([lit(x) for x in S.LEASED_STATES]),
                                J.c.lease_owner == me)
                .values(progress=v))
            return int(res.rowcount)

        return write

    async def close(self, write: bool = True) -> None:
        """The attempt ended: stop the timer and (if ``write``) land a held report first."""
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await timer
        if write and self._pending is not None and not self._lost:
            try:
                await self._write()
            except Exception as exc:  # the finalize is fenced the same way: nothing lost
                log.debug("job %s: last progress not written (%s)", self._c.id, exc)

    def abandon(self) -> None:
        """The attempt was torn down (its task cancelled): drop what is held."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _lost_error(self) -> Exception:
        c = self._c
        return LeaseLostError(f"job {c.id} attempt {c.attempt} no longer holds its lease")

"""The split release of a wide fan-out: a finished job that thousands of jobs wait on.

Releasing every dependent in the finalize that finishes their upstream would hold up the
first of them until the last is written. Where the dialect finalizes by one call of a
server-side routine (PostgreSQL, ``dialects/postgresql/``), that call splits the release:

1. **In line.** The finalize call finishes a job on which more than ``max(4 x n, SPLIT)``
   jobs wait, none of them a container (``n``: what the call leases along for the worker's
   free slots). It releases only that many, the first in claim order (priority, then id),
   records the ids of the others in the ``releases`` table in parts of at most ``PART``
   jobs (same transaction, so a crash loses nothing), and reports the split.
2. **The rest, beside the first jobs.** The worker that made the call then runs
   ``SplitReleases.release_rest()``: a task, not awaited, that calls the rest routine on
   a connection of its own until no part is left. Each call takes the first part (SKIP
   LOCKED: parts taken by a call in flight are skipped), takes the one edge to the
   finished job off each of its jobs, releases those with nothing left to wait on,
   deletes the part and wakes workers: one transaction per part, in order.
3. **A part left behind** (its worker died, or its call failed) is taken by any worker's
   next sweep (``leases.Reclaimer``); ``run_until_idle`` is not idle while one is left.
4. **Retry.** ``Actions.retry`` takes revived jobs out of the recorded parts first: their
   ``pending`` is counted afresh, where a done upstream no longer counts.
5. **Close.** ``JobQueue.close`` lets rest calls in flight land first (a part left: a
   sweep's).

The routines are built by ``dialects/postgresql/routines.py`` (``settle_routine``) from the
bodies ``finish.sql`` (the in-line split: ``split.sql``) and ``rest.sql`` beside it, and
installed by ``finalize_routines.install_routines``; their split parameters are SPLIT and PART below
(tests lower SPLIT to split small fan-outs).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from .database import Database
from .logs import brief

log = logging.getLogger("aiojobqueue")

#: The finalize call of a job that many jobs wait on releases this many of them (4x what it
#: leases along, where that is more), the rest right after in calls of their own.
SPLIT = 128
#: The rest of a split release is recorded (and released) in parts of at most this many
#: jobs, each its own transaction, so the first part is runnable before the last is written.
PART = 256


class SplitReleases:
    """Releases the recorded rest of split releases (see the module docstring)."""

    def __init__(self, db: Database, rest_call: Any, wake: Callable[[], None]) -> None:
        self.db = db
        #: the rest routine's call (None: the dialect never splits)
        self.rest_call = rest_call
        self.wake = wake
        #: calls releasing the rest, in flight (held: tasks are weakly kept)
        self.resting: set[asyncio.Task[Any]] = set()

    def release_rest(self) -> None:
        """A finalize just split a release: release the rest now, on a connection of its own,
        while the first of its jobs run. Not awaited: if it fails, the part it would have
        taken is left to a sweep, as if this process had died."""
        task = asyncio.get_running_loop().create_task(self.rest_releases())
        self.resting.add(task)
        task.add_done_callback(self.resting.discard)

    async def rest_releases(self, n: int = 64) -> int:
        """Release up to ``n`` recorded parts (any worker's), one transaction each, in order,
        waking the local worker as each lands. Returns how many were released."""
        stmt = self.rest_call
        done = 0
        while stmt is not None and done < n:
            try:
                took = await self.db.autocommit(lambda conn: conn.scalar(stmt, {"n": 1}))
            except Exception as exc:  # the part stays; a sweep takes it
                log.warning("releasing the rest of a wide fan-out failed (%s); a sweep "
                            "will", brief(exc))
                break
            if not took:
                break
            done += 1
            self.wake()
        return done

    async def any_left(self) -> bool:
        """Whether a split release has parts still to release."""
        if self.rest_call is None:
            return False
        R = self.db.t.releases

        async def look(conn: AsyncConnection) -> bool:
            return (await conn.execute(select(R.c.id).limit(1))).first() is not None

        return await self.db.read(look)

    async def close(self) -> None:
        """Let the calls in flight land (5 s at most; a part left is a sweep's)."""
        if not self.resting:
            return
        _, late = await asyncio.wait(list(self.resting), timeout=5.0)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late, timeout=1.0)

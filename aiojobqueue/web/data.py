"""Every database read the dashboard makes, in SQLAlchemy Core on the queue's engine.

Pages must stay fast on a table of millions of rows, so every query here is bounded: counts
stop at ``CAP`` (and say so), a filtered job list scans at most ``WINDOW`` ids per page, and a
DAG is fetched up to ``DAG_FETCH`` nodes. States are written as SQL literals so the planners
(SQLite's in particular) match them against the partial state indexes of ``schema.py``.
Writes go through the public ``JobQueue.retry`` / ``JobQueue.cancel`` only (see ``actions``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Text, cast, func, literal, select
from sqlalchemy.ext.asyncio import AsyncConnection

from .. import schema as S
from ..errors import InvalidStateError, JobNotFoundError
from ..explain import explain
from ..models import JobState
from ..snapshot import to_job
from ..stored_policy import VERSION_KEY
from ..tags import BULK_MAX, tagged_ids
from ..timeutil import db_now
from . import views as V
from .dagreads import DagReads, group_states
from .overview import OverviewReads
from .reader import error_line, first_row, types_of
from .views import (
    CANCELLABLE,
    DAG_DRAW,
    LEAF_COUNTED,
    LIVE_WORKER,
    MARK_CAP,
    PAGE,
    RETRYABLE,
    STATES,
    Count,
    Filters,
    Graph,
    JobDetail,
    JobPage,
    JobRow,
    Node,
    ScheduleRow,
    WorkerRow,
    count_of,
    lit,
    parse_id,
)

if TYPE_CHECKING:
    from ..queue import JobQueue

log = logging.getLogger("aiojobqueue")

#: The names the pages and tests read from here (``data.Count``, ``data.Filters``...).
__all__ = [
    "BULK_MAX", "CANCELLABLE", "DAG_DRAW", "LEAF_COUNTED", "RETRYABLE", "STATES", "Count",
    "Data", "Filters", "Graph", "Node", "act", "group_states", "parse_id",
]


class Data(OverviewReads, DagReads):
    """The dashboard's reads for one queue: the overview (``overview.py``), the DAG
    (``dagreads.py``), and here the change marker, the job list, one job, the workers and
    the schedules."""

    # -- the change marker (live updates) ---------------------------------------------------
    async def marker(self) -> tuple[Any, ...]:
        """A cheap value that changes when any job is enqueued, claimed, finished or revived,
        or the stored policy changes: each part is one index probe."""
        J = self.t.jobs

        def newest(state: str) -> Any:
            return (select(J.c.finished_at).where(J.c.state == lit(state),
                                                  J.c.finished_at.is_not(None))
                    .order_by(J.c.finished_at.desc()).limit(1).scalar_subquery())

        stmt = self._stmt("marker", lambda: select(
            select(func.max(J.c.id)).scalar_subquery(),
            newest(S.DONE), newest(S.FAILED), newest(S.CANCELLED),
            # small caps, in index order: the marker only needs to notice a change
            self._capped(S.RUNNING, order=J.c.group_key, cap=MARK_CAP),
            self._capped(S.READY, order=J.c.group_key, cap=MARK_CAP),
            self._capped(S.SCHEDULED, order=J.c.run_after, cap=MARK_CAP),
            # the stored policy's version: an edit re-renders every open overview
            select(self.t.meta.c.value).where(self.t.meta.c.name == VERSION_KEY)
            .scalar_subquery(),
        ))
        return tuple(await self._read(lambda c: first_row(c, stmt)))


    # -- the job list -----------------------------------------------------------------------
    def _where(self, f: Filters) -> list[Any]:
        J = self.t.jobs
        cond: list[Any] = []
        if f.state is not None:
            cond.append(J.c.state == lit(f.state))
        if f.group is not None:
            cond.append(J.c.group_key == f.group)
        if f.type is not None:
            cond.append(J.c.type == f.type)
        if f.parent is not None:
            cond.append(J.c.parent_id == f.parent)
        if f.q is not None:
            cond.append(cast(J.c.error, Text).icontains(f.q, autoescape=True))
        return cond

    def _from(self, f: Filters, cols: Sequence[Any]) -> tuple[Any, Any]:
        """SELECT ``cols`` FROM jobs, and the id column to range and order on: with a tag
        filter, driven by the tags table's (tag, job_id) index (newest first, one index
        range, however rare the tag), else by the jobs' primary key."""
        J, T = self.t.jobs, self.t.tags
        if f.tag is None:
            return select(*cols), J.c.id
        stmt = select(*cols).select_from(T).join(J, J.c.id == T.c.job_id)
        return stmt.where(T.c.tag == f.tag), T.c.job_id

    async def jobs(self, f: Filters, before: int | None = None, limit: int = PAGE) -> JobPage:
        """The newest jobs matching ``f`` below id ``before``. A filtered page looks at
        WINDOW ids at most, so a filter matching few rows never scans the whole table; it
        then offers the next window (``next_before``)."""
        J = self.t.jobs
        cond = self._where(f)
        base, idc = self._from(f, (J.c.id, J.c.type, J.c.kind, J.c.state, J.c.group_key,
                                   J.c.attempts, J.c.parent_id, J.c.created_at,
                                   J.c.finished_at, J.c.error, J.c.max_attempts,
                                   J.c.attempt_limit, J.c.releases))

        async def read(conn: AsyncConnection) -> JobPage:
            hi = before
            if hi is None:
                top = await conn.scalar(select(func.max(J.c.id)))
                if top is None:
                    return JobPage([], None, None)
                hi = int(top) + 1
            where = [idc < hi, *cond]
            lo: int | None = None
            if cond:  # (a tag alone is its own index range: no window needed)
                lo = max(hi - V.WINDOW, 0)
                where.append(idc >= lo)
            rows = (await conn.execute(
                base.where(*where).order_by(idc.desc()).limit(limit + 1))).all()
            out = [JobRow(r.id, r.type, r.kind, r.state, r.group_key, r.attempts, r.parent_id,
                          r.created_at, r.finished_at, error_line(r.error), r.max_attempts,
                          r.attempt_limit, r.releases) for r in rows[:limit]]
            if len(rows) > limit:
                return JobPage(out, out[-1].id, lo)
            if lo is not None and lo > 0:
                low = await conn.scalar(select(func.min(J.c.id)))
                if low is not None and lo > int(low):
                    return JobPage(out, lo, lo)
            return JobPage(out, None, lo)

        return await self._read(read)

    async def match_ids(self, f: Filters, states: Sequence[str]) -> tuple[list[int], Count]:
        """Ids (newest first, at most BULK_MAX) of jobs matching ``f`` whose state is one of
        ``states``, and how many there are (capped): what a bulk action would change."""
        J = self.t.jobs
        wanted = [s for s in states if f.state is None or s == f.state]
        if not wanted:
            return [], Count(0)
        cond = self._where(Filters(None, f.group, f.type, f.parent, f.q))
        parts = [select(J.c.id).where(J.c.state == lit(s), *cond)
                 .order_by(J.c.id.desc()).limit(BULK_MAX + 1) for s in wanted]

        async def read(conn: AsyncConnection) -> list[int]:
            if f.tag is not None:  # from the smaller side (see tags.tagged_ids)
                return await tagged_ids(conn, J, self.t.tags, f.tag, wanted, BULK_MAX + 1,
                                        cond)
            ids: list[int] = []
            for p in parts:  # one index range per state
                ids += [r[0] for r in await conn.execute(p)]
            return sorted(ids, reverse=True)

        ids = await self._read(read)
        return ids[:BULK_MAX], count_of(len(ids), BULK_MAX)

    # -- one job ----------------------------------------------------------------------------
    async def job(self, job_id: int) -> JobDetail:
        """A job with what its page shows, all of it from one read of its row: the state,
        the facts and the explanation never mix two moments. Raises JobNotFoundError."""
        J, D, W = self.t.jobs, self.t.deps, self.t.workers

        async def read(conn: AsyncConnection) -> JobDetail:
            now = (await conn.execute(select(db_now()))).scalar_one()
            row = (await conn.execute(select(J).where(J.c.id == job_id))).first()
            if row is None:
                raise JobNotFoundError(f"no job with id {job_id}")
            deps = [r[0] for r in await conn.execute(
                select(D.c.depends_on_id).where(D.c.job_id == job_id)
                .order_by(D.c.depends_on_id))]
            job = to_job(row, deps)
            expires = None
            seen = None
            if job.state in (JobState.RUNNING, JobState.LEASED) and row.lease_expires is not None:
                expires = (row.lease_expires - now).total_seconds()
                last = await conn.scalar(select(W.c.last_seen).where(W.c.id == job.lease_owner))
                seen = None if last is None else max((now - last).total_seconds(), 0.0)
            children = await self._children(conn, job_id) if job.is_container else {}
            down = (await conn.execute(
                select(J.c.id, J.c.type, J.c.state).join(D, D.c.job_id == J.c.id)
                .where(D.c.depends_on_id == job_id).order_by(J.c.id).limit(51))).all()
            up = (await conn.execute(
                select(J.c.id, J.c.type, J.c.state).join(D, D.c.depends_on_id == J.c.id)
                .where(D.c.job_id == job_id).order_by(J.c.id).limit(200))).all()
            return JobDetail(
                job, row.checkpoint, row.timeout, row.attempt_limit, expires,
                bool(row.cancel_requested), seen, job.progress, list(job.errors),
                children, [(r.id, r.type, r.state) for r in down[:50]], len(down) > 50,
                [(r.id, r.type, r.state) for r in up], now, await self._why(conn, row))

        return await self._read(read)

    async def _children(self, conn: AsyncConnection, job_id: int) -> dict[str, Count]:
        J = self.t.jobs
        children: dict[str, Count] = {}
        for s in STATES:
            n = await conn.scalar(select(func.count()).select_from(
                select(literal(1).label("x")).where(J.c.parent_id == job_id,
                                                    J.c.state == lit(s))
                .limit(V.CAP + 1).subquery()))
            if n:
                children[s] = count_of(int(n))
        return children

    async def _why(self, conn: AsyncConnection, row: Any) -> Any:
        """``explain()`` of this row, on this connection (None if it fails: the page still
        shows everything else)."""
        started = getattr(self.q, "_started", None)
        if started is None:
            return None
        try:
            return await explain(started(), row.id, conn, row)
        except Exception as exc:  # the page must render without it
            log.warning("explain(%s) failed: %s", row.id, exc)
            return None


    # -- workers and schedules --------------------------------------------------------------
    async def workers(self) -> list[WorkerRow]:
        """Registered workers, live ones first, with the jobs they hold now."""
        J, W = self.t.jobs, self.t.workers
        types_col = W.c.get("types")

        async def read(conn: AsyncConnection) -> list[WorkerRow]:
            now = (await conn.execute(select(db_now()))).scalar_one()
            held: dict[str, int] = dict((await conn.execute(
                select(J.c.lease_owner, func.count()).where(J.c.state == lit(S.RUNNING))
                .group_by(J.c.lease_owner))).all())
            cols = [W.c.id, W.c.host, W.c.pid, W.c.started_at, W.c.last_seen]
            if types_col is not None:
                cols.append(types_col)
            out = []
            for r in await conn.execute(select(*cols).order_by(W.c.last_seen.desc()).limit(500)):
                ago = max((now - r.last_seen).total_seconds(), 0.0)
                types = types_of(r._mapping.get("types")) if types_col is not None else None
                out.append(WorkerRow(r.id, r.host, r.pid, r.started_at, ago,
                                     int(held.get(r.id, 0)), types, ago <= LIVE_WORKER))
            return out

        return await self._read(read)

    async def schedules(self) -> list[ScheduleRow]:
        """Every schedule in the schedules table (``JobQueue.schedules``)."""
        return [ScheduleRow(i.name, i.type, i.period, i.last_slot, i.last_state, i.next_slot,
                            i.tz, i.paused)
                for i in await self.q.schedules()]




# -- actions --------------------------------------------------------------------------------
async def act(queue: JobQueue, action: str, ids: Sequence[int]) -> tuple[int, list[str]]:
    """Retry or cancel each job (the public API); returns how many changed and the refusals
    (a job that moved on meanwhile is skipped, not an error)."""
    done, problems = 0, []
    for jid in ids:
        try:
            if action == "retry":
                await queue.retry(jid)
            else:
                await queue.cancel(jid)
            done += 1
        except (InvalidStateError, JobNotFoundError) as exc:
            problems.append(str(exc))
    return done, problems



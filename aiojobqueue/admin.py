"""Operator queries: status counts, job listings, a job's DAG neighbourhood (pruning is
``prune.py``).

The command line is a thin shell over these functions; each takes a started ``JobQueue`` and
works on every dialect. Ages are measured against the database clock, like leases.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import Enum
from typing import TYPE_CHECKING, Any

from sqlalchemy import case, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from . import tags
from .errors import InvalidJobError, JobNotFoundError
from .models import Job, JobState
from .snapshot import to_job
from .sql import chunks, lit
from .timeutil import as_utc, db_now

if TYPE_CHECKING:
    from .queue import JobQueue

LEAF_STATES = (S.WAITING, S.SCHEDULED, S.READY, S.RUNNING, S.LEASED, S.DONE, S.FAILED, S.CANCELLED)


# -- status ---------------------------------------------------------------------------------
@dataclass
class GroupStatus:
    """Leaf-job counts of one group (containers are counted apart, in ``Status.containers``)."""

    group: str
    counts: dict[str, int] = field(default_factory=dict)
    #: Seconds since the oldest ready job of the group was enqueued or became due.
    oldest_ready_age: float | None = None

    def count(self, state: str) -> int:
        return self.counts.get(state, 0)


@dataclass
class WorkerInfo:
    """One row of the worker registry (refreshed by every heartbeat)."""

    id: str
    host: str
    pid: int
    started_at: datetime
    last_seen: datetime
    #: Jobs it runs now: its rows in state ``running``, read with the group counts (so the
    #: two tables of ``status`` agree), not the count its last heartbeat wrote.
    running: int
    #: Seconds since its last heartbeat.
    seen_ago: float
    #: Jobs it holds ahead (state ``leased``: not started, counted by no cap).
    leased: int = 0


@dataclass
class Status:
    """What ``aiojobqueue status`` shows."""

    now: datetime
    #: Leaf jobs per state, all groups together.
    totals: dict[str, int]
    #: Containers per state.
    containers: dict[str, int]
    groups: list[GroupStatus]
    #: Workers whose last heartbeat is at most ``recent`` seconds old.
    workers: list[WorkerInfo]
    #: Registered workers not seen for longer (stopped or dead; ``prune`` removes old ones).
    stale_workers: int
    recent: float
    #: Recorded parts of split releases not yet released (PostgreSQL; each lives for
    #: milliseconds unless every worker that could release it is gone).
    releasing: int = 0

    @property
    def oldest_ready_age(self) -> float | None:
        ages = [g.oldest_ready_age for g in self.groups if g.oldest_ready_age is not None]
        return max(ages) if ages else None


async def now(q: JobQueue) -> datetime:
    """The database's current time."""
    return await q._read(lambda conn: _now(conn))


async def _now(conn: AsyncConnection) -> datetime:
    value = (await conn.execute(select(db_now()))).scalar_one()
    assert isinstance(value, datetime)
    return value


async def _owned(conn: AsyncConnection, J: Any) -> dict[tuple[str, str], int]:
    """(worker id, running | leased) -> how many rows it holds, in the status snapshot."""
    rows = await conn.execute(
        select(J.c.lease_owner, J.c.state, func.count())
        .where(J.c.state.in_([lit(x) for x in S.LEASED_STATES]), J.c.kind == lit(S.JOB))
        .group_by(J.c.lease_owner, J.c.state))
    return {(owner, state): int(n) for owner, state, n in rows if owner is not None}


async def status(q: JobQueue, recent: float = 60.0) -> Status:
    """Counts per group and state, the oldest ready job's age, workers seen in ``recent`` s."""
    J, W = q._t.jobs, q._t.workers
    since = case((J.c.run_after > J.c.created_at, J.c.run_after), else_=J.c.created_at)

    async def read(conn: AsyncConnection) -> Status:
        t = await _now(conn)
        rows = (await conn.execute(
            select(J.c.group_key, J.c.kind, J.c.state, func.count())
            .group_by(J.c.group_key, J.c.kind, J.c.state)
        )).all()
        oldest = dict((await conn.execute(
            select(J.c.group_key, func.min(since)).where(J.c.state == lit(S.READY))
            .group_by(J.c.group_key)
        )).all())
        wrows = (await conn.execute(select(W).order_by(W.c.started_at, W.c.id))).all()
        owned = await _owned(conn, J)
        releasing = int(await conn.scalar(
            select(func.count()).select_from(q._t.releases)) or 0)
        groups: dict[str, GroupStatus] = {}
        totals: dict[str, int] = defaultdict(int)
        boxes: dict[str, int] = defaultdict(int)
        for g, kind, state, n in rows:
            if kind == S.CONTAINER:
                boxes[state] += n
                continue
            gs = groups.setdefault(g, GroupStatus(g))
            gs.counts[state] = gs.counts.get(state, 0) + n
            totals[state] += n
        for g, ts in oldest.items():
            if ts is not None and g in groups:
                groups[g].oldest_ready_age = max((t - as_utc(ts)).total_seconds(), 0.0)
        workers, stale = [], 0
        for w in wrows:
            ago = max((t - w.last_seen).total_seconds(), 0.0)
            if ago <= recent:
                workers.append(WorkerInfo(w.id, w.host, w.pid, w.started_at, w.last_seen,
                                          owned.get((w.id, S.RUNNING), 0), ago,
                                          owned.get((w.id, S.LEASED), 0)))
            else:
                stale += 1
        return Status(t, dict(totals), dict(boxes), sorted(groups.values(), key=lambda g: g.group),
                      workers, stale, recent, releasing)

    return await q._read(read)


# -- jobs -----------------------------------------------------------------------------------
async def list_jobs(
    q: JobQueue,
    *,
    state: str | None = None,
    group: str | None = None,
    type: str | None = None,
    parent: int | None = None,
    limit: int = 50,
    tag: str | None = None,
) -> list[Job]:
    """The newest jobs first, optionally filtered. Raises InvalidJobError on a bad state
    (InvalidTagError on a bad tag)."""
    J = q._t.jobs
    if state is not None and state not in {s.value for s in JobState}:
        raise InvalidJobError(
            f"unknown state {state!r}; one of {', '.join(s.value for s in JobState)}"
        )
    if limit < 1:
        raise InvalidJobError(f"limit must be >= 1: {limit}")
    cond = []
    if state is not None:
        cond.append(J.c.state == state)
    if group is not None:
        cond.append(J.c.group_key == group)
    if type is not None:
        cond.append(J.c.type == type)
    if parent is not None:
        cond.append(J.c.parent_id == parent)
    stmt, idc = select(J), J.c.id
    if tag is not None:  # driven by the (tag, job_id) index: see tags.py
        T = q._t.tags
        stmt = select(J).select_from(T).join(J, J.c.id == T.c.job_id).where(
            T.c.tag == tags.check_tag(tag))
        idc = T.c.job_id

    async def read(conn: AsyncConnection) -> list[Job]:
        rows = (await conn.execute(stmt.where(*cond).order_by(idc.desc()).limit(limit)))
        return await _jobs(q, conn, rows.all())

    return await q._read(read)


async def _jobs(q: JobQueue, conn: AsyncConnection, rows: Sequence[Any]) -> list[Job]:
    D = q._t.deps
    deps: dict[int, list[int]] = defaultdict(list)
    ids = [r.id for r in rows]
    for part in chunks(ids):
        for jid, up in await conn.execute(
            select(D.c.job_id, D.c.depends_on_id).where(D.c.job_id.in_(part))
            .order_by(D.c.depends_on_id)
        ):
            deps[jid].append(up)
    labels = await tags.tags_of(conn, q._t.tags, ids)
    return [to_job(r, deps[r.id], labels.get(r.id, ())) for r in rows]


@dataclass
class JobGraph:
    """One job and its neighbourhood in the DAG."""

    job: Job
    #: Its containers, outermost first.
    ancestors: list[Job]
    #: Its children (containers only), up to the limit asked for; ``children_total`` counts all.
    children: list[Job]
    children_total: int
    #: Child counts per state (containers only).
    children_states: dict[str, int]
    #: The jobs it depends on.
    dependencies: list[Job]
    #: The jobs that depend on it, up to the limit; ``dependents_total`` counts all.
    dependents: list[Job]
    dependents_total: int


async def graph(q: JobQueue, job_id: int, limit: int = 100) -> JobGraph:
    """A job with its container ancestry, children, dependencies and dependents."""
    J, D = q._t.jobs, q._t.deps

    async def read(conn: AsyncConnection) -> JobGraph:
        row = (await conn.execute(select(J).where(J.c.id == job_id))).first()
        if row is None:
            raise JobNotFoundError(f"no job with id {job_id}")
        (job,) = await _jobs(q, conn, [row])
        ancestors: list[Any] = []
        parent = row.parent_id
        while parent is not None and len(ancestors) < 100:
            p = (await conn.execute(select(J).where(J.c.id == parent))).first()
            if p is None:
                break
            ancestors.insert(0, p)
            parent = p.parent_id
        kids = (await conn.execute(
            select(J).where(J.c.parent_id == job_id).order_by(J.c.id).limit(limit))).all()
        kid_states: dict[str, int] = dict((await conn.execute(
            select(J.c.state, func.count()).where(J.c.parent_id == job_id).group_by(J.c.state)
        )).all())
        ups = (await conn.execute(
            select(J).join(D, D.c.depends_on_id == J.c.id).where(D.c.job_id == job_id)
            .order_by(J.c.id))).all()
        downs = (await conn.execute(
            select(J).join(D, D.c.job_id == J.c.id).where(D.c.depends_on_id == job_id)
            .order_by(J.c.id).limit(limit))).all()
        n_downs = (await conn.execute(
            select(func.count()).select_from(D).where(D.c.depends_on_id == job_id))).scalar_one()
        return JobGraph(
            job, await _jobs(q, conn, ancestors), await _jobs(q, conn, kids),
            sum(kid_states.values()), {str(k): int(v) for k, v in kid_states.items()},
            await _jobs(q, conn, ups), await _jobs(q, conn, downs), int(n_downs),
        )

    return await q._read(read)


# -- operator actions -----------------------------------------------------------------------
async def cancel(q: JobQueue, job_id: int) -> str:
    """Cancel a job; returns ``cancelled``, ``running`` (a cancel request its worker honours
    within a heartbeat) or the terminal state it already had."""
    actions = q._started().actions
    return await q._write(lambda conn: actions.cancel(conn, job_id))


async def retry(q: JobQueue, job_id: int) -> list[int]:
    """Retry a failed or cancelled job; returns every id revived with it."""
    core = q._started()
    ids = await q._write(lambda conn: core.actions.retry(conn, job_id))
    core.signals.wake()
    return ids


# -- plain data for --json ------------------------------------------------------------------
def to_data(obj: Any) -> Any:
    """Dataclasses, enums and datetimes as JSON-ready values."""
    if hasattr(obj, "__dataclass_fields__"):
        d = asdict(obj)
        if isinstance(obj, Status):
            d["oldest_ready_age"] = obj.oldest_ready_age
        return to_data(d)
    if isinstance(obj, dict):
        return {str(k): to_data(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_data(v) for v in obj]
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, datetime):
        return obj.isoformat()
    return obj

"""Every database read the dashboard makes, in SQLAlchemy Core on the queue's engine.

Pages must stay fast on a table of millions of rows, so every query here is bounded: counts
stop at ``CAP`` (and say so), a filtered job list scans at most ``WINDOW`` ids per page, and a
DAG is fetched up to ``DAG_FETCH`` nodes. States are written as SQL literals so the planners
(SQLite's in particular) match them against the partial state indexes of ``schema.py``.
Writes go through the public ``JobQueue.retry`` / ``JobQueue.cancel`` only (see ``actions``).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Text, bindparam, case, cast, func, inspect, literal, literal_column, select
from sqlalchemy.ext.asyncio import AsyncConnection

from .. import schema as S
from ..errors import InvalidJobError, InvalidStateError, JobNotFoundError
from ..limits import RateLimit
from ..models import Job, JobState
from ..policy import GroupDemand, fair_share
from ..timeutil import UTCDateTime, as_utc, db_now, utcnow_plus

if TYPE_CHECKING:
    from ..queue import JobQueue

T = TypeVar("T")

#: Counts stop here: "10,000+" is as useful to an operator as the exact figure and costs a
#: bounded index range instead of a scan of millions of rows.
CAP = 10_000
#: ... and a group's count, where a state has more than CAP rows in all.
GROUP_CAP = 500
#: The change marker's counts (it only needs to notice a change).
MARK_CAP = 1_000
#: Ids one page of a filtered job list looks at, at most (a sparse filter pages on).
WINDOW = 50_000
#: Rows per page of the job list.
PAGE = 50
#: Groups the overview lists (the busiest first).
MAX_GROUPS = 100
#: Ready jobs per group looked at for the oldest one's age (beyond: a lower bound).
AGE_PROBE = 100
#: Finished jobs per state the throughput chart counts (beyond: the oldest minutes are short).
RATE_PROBE = 50_000
#: DAG nodes fetched at most; the page draws ``DAG_DRAW`` and summarises the rest.
DAG_FETCH = 2_000
DAG_DRAW = 500
#: Children of one container drawn at most; the rest become one summary box.
DAG_CHILDREN = 60
#: Jobs one bulk action changes at most (the confirmation page says so).
BULK_MAX = 10_000
#: Workers seen within this many seconds count as live.
LIVE_WORKER = 60.0

STATES = tuple(s.value for s in JobState)
LEAF_COUNTED = (S.READY, S.RUNNING, S.SCHEDULED, S.WAITING, S.FAILED)
RETRYABLE = (S.FAILED, S.CANCELLED)
CANCELLABLE = S.LIVE
MAX_TEXT = 200


def lit(state: str) -> Any:
    """A known state as a SQL literal (a bind parameter would not match a partial index)."""
    if state not in STATES:  # pragma: no cover - callers pass constants or checked input
        raise InvalidJobError(f"unknown state {state!r}")
    return literal_column(f"'{state}'")


@dataclass(frozen=True)
class Count:
    """A count that stops at ``CAP``."""

    n: int
    capped: bool = False

    def __str__(self) -> str:
        return f"{self.n:,}+" if self.capped else f"{self.n:,}"

    def json(self) -> dict[str, Any]:
        return {"n": self.n, "capped": self.capped}


def _count(n: int, cap: int | None = None) -> Count:
    cap = CAP if cap is None else cap
    return Count(min(n, cap), n > cap)


# -- page data ------------------------------------------------------------------------------
@dataclass
class GroupRow:
    """One group on the overview."""

    group: str
    weight: int
    running: int
    target: int | None
    cap: int | None
    counts: dict[str, Count]
    #: Seconds the oldest ready job has waited; ``age_min`` marks a lower bound.
    oldest_ready: float | None
    age_min: bool = False


@dataclass
class Gauge:
    """A cap and how much of it is used now."""

    name: str
    used: int
    limit: int | None
    detail: str = ""


@dataclass
class Overview:
    """The overview page."""

    now: datetime
    groups: list[GroupRow]
    groups_total: int
    totals: dict[str, Count]
    gauges: list[Gauge]
    #: Per minute over the last hour, oldest first: (minute start, done, failed).
    throughput: list[tuple[datetime, int, int]]
    #: The chart's oldest minutes are short because more than RATE_PROBE jobs finished.
    throughput_capped: bool
    workers_live: int


@dataclass(frozen=True)
class Filters:
    """The filters of the job list and the bulk actions (all optional)."""

    state: str | None = None
    group: str | None = None
    type: str | None = None
    parent: int | None = None
    q: str | None = None

    @classmethod
    def parse(cls, params: Any) -> Filters:
        """From query or form parameters; raises InvalidJobError on a bad value."""

        def text(name: str) -> str | None:
            v = params.get(name)
            if v is None or not str(v).strip():
                return None
            v = str(v).strip()
            if len(v) > MAX_TEXT:
                raise InvalidJobError(f"{name} is longer than {MAX_TEXT} characters")
            return v

        state = text("state")
        if state is not None and state not in STATES:
            raise InvalidJobError(f"unknown state {state!r}; one of {', '.join(STATES)}")
        parent = text("parent")
        pid: int | None = None
        if parent is not None:
            pid = parse_id(parent, "parent")
        return cls(state, text("group"), text("type"), pid, text("q"))

    def items(self) -> dict[str, str]:
        """The filters that are set, as query parameters."""
        out = {"state": self.state, "group": self.group, "type": self.type,
               "parent": None if self.parent is None else str(self.parent), "q": self.q}
        return {k: v for k, v in out.items() if v is not None}

    @property
    def any(self) -> bool:
        return bool(self.items())


def parse_id(value: Any, name: str = "id") -> int:
    """A job id from text; raises InvalidJobError."""
    try:
        n = int(str(value))
    except ValueError:
        raise InvalidJobError(f"{name} must be a job id (a positive integer): {value!r}") from None
    if not 0 < n < 2**63:
        raise InvalidJobError(f"{name} must be a job id (a positive integer): {value!r}")
    return n


@dataclass
class JobRow:
    """One line of the job list."""

    id: int
    type: str
    kind: str
    state: str
    group: str
    attempts: int
    parent_id: int | None
    created_at: datetime
    finished_at: datetime | None
    error: str | None


@dataclass
class JobPage:
    """A page of the job list, newest first."""

    rows: list[JobRow]
    #: Pass as ``before`` for the next (older) page; None: no older rows.
    next_before: int | None
    #: The ids this page looked at went down to here (a filtered page scans a window).
    scanned_to: int | None


@dataclass
class JobDetail:
    """Everything the job page shows."""

    job: Job
    checkpoint: Any
    timeout: float | None
    attempt_limit: int
    lease_expires_in: float | None
    cancel_requested: bool
    worker_seen_ago: float | None
    progress: Any
    errors: list[dict[str, Any]] | None
    children: dict[str, Count]
    dependents: list[tuple[int, str, str]]
    dependents_more: bool
    dependencies: list[tuple[int, str, str]]
    now: datetime


@dataclass
class Node:
    """A DAG node as fetched."""

    id: int
    type: str
    kind: str
    state: str
    parent_id: int | None
    group: str


@dataclass
class Graph:
    """A job's DAG: nodes, dependency edges (upstream, downstream), container summaries."""

    focus: int
    nodes: dict[int, Node]
    edges: list[tuple[int, int]]
    #: Children of a container left out of ``nodes``: container id -> state -> count.
    hidden_children: dict[int, dict[str, int]] = field(default_factory=dict)
    #: Nodes of the DAG not fetched at all (past DAG_FETCH) or not drawn (past DAG_DRAW).
    truncated: bool = False


@dataclass
class WorkerRow:
    """One registered worker."""

    id: str
    host: str
    pid: int
    started_at: datetime
    seen_ago: float
    running: int
    types: list[str] | None
    live: bool


@dataclass
class ScheduleRow:
    """One periodic schedule: known from this process's queue, or only from its mark."""

    name: str
    type: str | None
    every: str | None
    last_slot: datetime | None
    last_state: str | None
    next_slot: datetime | None


# -- the data layer -------------------------------------------------------------------------
class Data:
    """The dashboard's reads for one queue."""

    def __init__(self, queue: JobQueue) -> None:
        self.q = queue
        self.t = S.build_tables(queue.prefix)
        # Statements built once per shape, values bound per call: SQLAlchemy then reuses
        # their cache keys and compiled forms (building the wide ones costs more than
        # running them on small tables).
        self._stmts: dict[Any, Any] = {}
        self._covered: set[str] | None = None

    def _stmt(self, key: Any, build: Callable[[], Any]) -> Any:
        got = self._stmts.get(key)
        if got is None:
            got = self._stmts[key] = build()
        return got

    async def _read(self, fn: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        async with self.q.engine.connect() as conn:
            return await fn(conn)

    # -- the change marker (live updates) ---------------------------------------------------
    async def marker(self) -> tuple[Any, ...]:
        """A cheap value that changes when any job is enqueued, claimed, finished or revived:
        each part is one index probe."""
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
        ))
        return tuple(await self._read(lambda c: _first(c, stmt)))

    def _capped(self, state: str, *where: Any, order: Any = None, cap: int | None = None) -> Any:
        """``count(*)`` of ``state`` rows (and ``where``), stopping past ``cap``. ``order``
        (a column of the index to use) keeps a planner from choosing a table scan that
        expects matches spread evenly when they sit together at the end."""
        J = self.t.jobs
        n = CAP if cap is None else cap
        inner = select(literal(1).label("x")).where(J.c.state == lit(state), *where)
        if order is not None:
            inner = inner.order_by(order)
        inner = inner.limit(n + 1)
        return select(func.count()).select_from(inner.subquery()).scalar_subquery()

    # -- overview ---------------------------------------------------------------------------
    async def overview(self) -> Overview:
        """Per-group backlog and fair share, the caps as gauges, the last hour's throughput."""
        q, G = self.q, self.t.groups

        async def read(conn: AsyncConnection) -> Overview:
            now = (await conn.execute(select(db_now()))).scalar_one()
            covered = await self._per_group_indexed(conn)
            probed = [s for s in LEAF_COUNTED if s in covered]
            # a covering index leads with (state, group_key): its order
            firsts: list[Any] = [self._capped(s, order=self.t.jobs.c.group_key)
                                 for s in probed]
            totals_row = await _first(conn, select(*firsts)) if firsts else ()
            totals = {s: _count(int(n)) for s, n in zip(probed, totals_row, strict=True)}
            groups_total = int(await conn.scalar(select(func.count()).select_from(G)) or 0)
            names = [r[0] for r in await conn.execute(
                select(G.c.group_key).order_by(G.c.group_key).limit(MAX_GROUPS * 10))]
            per: dict[str, dict[str, Count]] = {g: {} for g in names}
            for state in LEAF_COUNTED:
                totals[state] = await self._group_counts(conn, state, totals.get(state), names,
                                                         per)
            # The busiest groups first; the page lists MAX_GROUPS.
            busy = sorted(names, key=lambda g: (
                -sum(c.n for s, c in per[g].items() if s != S.FAILED), -per[g][S.FAILED].n, g))
            shown = busy[:MAX_GROUPS]
            weights = await self._weights(conn, shown, per)
            ages = await self._ready_ages(conn, now, [g for g in shown if per[g][S.READY].n])
            demand = {
                g: GroupDemand(weights[g], 0, _min_cap(q.group_limits.get(g),
                                                       per[g][S.READY].n + per[g][S.RUNNING].n))
                for g in shown if per[g][S.READY].n or per[g][S.RUNNING].n
            }
            slots = q.concurrency if q.concurrency is not None else sum(
                per[g][S.RUNNING].n for g in shown)
            targets = fair_share(slots, demand) if q.concurrency is not None else {}
            groups = [
                GroupRow(g, weights[g], per[g][S.RUNNING].n,
                         targets.get(g, 0 if q.concurrency is not None else None)
                         if g in demand or q.concurrency is not None else None,
                         q.group_limits.get(g), per[g], *ages.get(g, (None, False)))
                for g in shown
            ]
            gauges = [Gauge("global cap", totals[S.RUNNING].n, q.concurrency,
                            "" if q.concurrency is not None else "no global cap set")]
            gauges += await self._rate_gauges(conn)
            series, capped = await self._throughput(conn, now)
            live = int(await conn.scalar(select(func.count()).select_from(self.t.workers).where(
                self.t.workers.c.last_seen > now - timedelta(seconds=LIVE_WORKER))) or 0)
            return Overview(now, groups, groups_total, totals, gauges, series, capped, live)

        return await self._read(read)

    async def _per_group_indexed(self, conn: AsyncConnection) -> set[str]:
        """The states some index leading with (state, group_key) covers (read once): their
        counts are capped probes per group. The others are counted in one GROUP BY, the
        single pass their rows cost without such an index."""
        if self._covered is None:
            name = self.t.jobs.name
            indexes = await conn.run_sync(lambda c: inspect(c).get_indexes(name))
            covered: set[str] = set()
            for ix in indexes:
                if list(ix["column_names"][:2]) != ["state", "group_key"]:
                    continue
                where = [str(v) for k, v in (ix.get("dialect_options") or {}).items()
                         if k.endswith("_where") and v is not None]
                covered |= ({st for st in STATES if any(f"'{st}'" in w for w in where)}
                            if where else set(STATES))
            self._covered = covered
        return self._covered

    async def _group_counts(self, conn: AsyncConnection, state: str, total: Count | None,
                            names: list[str], per: dict[str, dict[str, Count]]) -> Count:
        """Counts of ``state`` per group, and in all: one GROUP BY unless the state has more
        than CAP rows and an index by group (``total`` known), then a capped probe per
        group."""
        J = self.t.jobs
        if total is None or not total.capped:
            got: dict[str, int] = dict((await conn.execute(
                select(J.c.group_key, func.count()).where(J.c.state == lit(state))
                .group_by(J.c.group_key))).all())
            for g in names:
                per[g][state] = Count(int(got.get(g, 0)))
            return _count(sum(got.values())) if total is None else total
        for i in range(0, len(names), 50):
            part = names[i : i + 50]
            def build(state: str = state, k: int = len(part)) -> Any:
                probes: list[Any] = [self._capped(state, J.c.group_key == bindparam(f"g{i}"),
                                                  cap=GROUP_CAP) for i in range(k)]
                return select(*probes)

            stmt = self._stmt(("count", state, len(part), GROUP_CAP), build)
            row = await _first(conn, stmt, {f"g{i}": g for i, g in enumerate(part)})
            for g, n in zip(part, row, strict=True):
                per[g][state] = _count(int(n), GROUP_CAP)
        return total

    async def _weights(self, conn: AsyncConnection, groups: list[str],
                       per: dict[str, dict[str, Count]]) -> dict[str, int]:
        """A group's weight: the largest among its ready jobs (the claim's rule), else among
        its running ones, else 1."""
        J = self.t.jobs
        out = dict.fromkeys(groups, 1)
        ready = [g for g in groups if per[g][S.READY].n]
        for i in range(0, len(ready), 50):
            part = ready[i : i + 50]
            def build(k: int = len(part)) -> Any:
                tops: list[Any] = [
                    select(J.c.weight).where(J.c.state == lit(S.READY),
                                             J.c.group_key == bindparam(f"g{i}"), J.c.weight > 1)
                    .order_by(J.c.weight.desc()).limit(1).scalar_subquery() for i in range(k)]
                return select(*tops)

            stmt = self._stmt(("weight", len(part)), build)
            row = await _first(conn, stmt, {f"g{i}": g for i, g in enumerate(part)})
            for g, w in zip(part, row, strict=True):
                out[g] = int(w) if w is not None else 1
        running = [g for g in groups if per[g][S.RUNNING].n and not per[g][S.READY].n]
        if running:
            for g, w in await conn.execute(
                select(J.c.group_key, func.max(J.c.weight))
                .where(J.c.state == lit(S.RUNNING), J.c.group_key.in_(running))
                .group_by(J.c.group_key)):
                out[g] = int(w)
        return out

    async def _ready_ages(self, conn: AsyncConnection, now: datetime,
                          groups: list[str]) -> dict[str, tuple[float, bool]]:
        """Seconds since the oldest ready job of each group became due (enqueued, or its
        run_after). Looks at the AGE_PROBE next-to-run jobs of a group (the claim's index
        order); past that the age is a lower bound."""
        J = self.t.jobs
        since = case((J.c.run_after > J.c.created_at, J.c.run_after), else_=J.c.created_at)
        out: dict[str, tuple[float, bool]] = {}
        for i in range(0, len(groups), 25):
            part = groups[i : i + 25]
            def build(k: int = len(part)) -> Any:
                cols: list[Any] = []
                for i in range(k):
                    inner = (select(since.label("since"))
                             .where(J.c.state == lit(S.READY),
                                    J.c.group_key == bindparam(f"g{i}"))
                             .order_by(J.c.priority.desc(), J.c.id).limit(AGE_PROBE + 1)
                             .subquery())
                    cols += [select(func.min(inner.c.since)).scalar_subquery(),
                             select(func.count()).select_from(inner).scalar_subquery()]
                return select(*cols)

            stmt = self._stmt(("age", len(part)), build)
            row = await _first(conn, stmt, {f"g{i}": g for i, g in enumerate(part)})
            for k, g in enumerate(part):
                first, n = row[2 * k], int(row[2 * k + 1])
                if first is not None:
                    t = as_utc(first)
                    out[g] = (max((now - t).total_seconds(), 0.0), n > AGE_PROBE)
        return out

    async def _rate_gauges(self, conn: AsyncConnection) -> list[Gauge]:
        R = self.t.rate
        out = []
        for lim in self.q.limits:
            if not isinstance(lim, RateLimit):
                out.append(Gauge(type(lim).__name__, 0, None, "a custom limit (in-process)"))
                continue
            used = await conn.scalar(select(func.count()).select_from(R).where(
                R.c.name == lim.name, R.c.at > utcnow_plus(-lim.per)))
            out.append(Gauge(f"rate {lim.name}", int(used or 0), lim.n,
                             f"starts in the last {lim.per:g} s"))
        return out

    async def _throughput(self, conn: AsyncConnection,
                          now: datetime) -> tuple[list[tuple[datetime, int, int]], bool]:
        """Done and failed per minute over the last hour: one bounded index range per state,
        counted by 61 cumulative CASEs (no dialect's date functions needed)."""
        J = self.t.jobs
        end = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
        bounds = [end - timedelta(minutes=60 - i) for i in range(61)]

        def build(state: str) -> Any:
            inner = (select(J.c.finished_at.label("f"))
                     .where(J.c.state == lit(state),
                            J.c.finished_at >= bindparam("b0", type_=UTCDateTime()))
                     .order_by(J.c.finished_at.desc()).limit(RATE_PROBE).subquery())
            cols: list[Any] = [
                func.count(case((inner.c.f >= bindparam(f"b{i}", type_=UTCDateTime()), 1)))
                for i in range(61)]
            return select(*cols).select_from(inner)

        params = {f"b{i}": b for i, b in enumerate(bounds)}
        counts: dict[str, list[int]] = {}
        capped = False
        for state in (S.DONE, S.FAILED):
            stmt = self._stmt(("rate", state, RATE_PROBE), functools.partial(build, state))
            cum = [int(x) for x in await _first(conn, stmt, params)]
            capped = capped or cum[0] >= RATE_PROBE
            counts[state] = [cum[i] - cum[i + 1] for i in range(60)]
        series = [(bounds[i], counts[S.DONE][i], counts[S.FAILED][i]) for i in range(60)]
        return series, capped

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

    async def jobs(self, f: Filters, before: int | None = None, limit: int = PAGE) -> JobPage:
        """The newest jobs matching ``f`` below id ``before``. A filtered page looks at
        WINDOW ids at most, so a filter matching few rows never scans the whole table; it
        then offers the next window (``next_before``)."""
        J = self.t.jobs
        cond = self._where(f)

        async def read(conn: AsyncConnection) -> JobPage:
            hi = before
            if hi is None:
                top = await conn.scalar(select(func.max(J.c.id)))
                if top is None:
                    return JobPage([], None, None)
                hi = int(top) + 1
            where = [J.c.id < hi, *cond]
            lo: int | None = None
            if cond:
                lo = max(hi - WINDOW, 0)
                where.append(J.c.id >= lo)
            rows = (await conn.execute(
                select(J.c.id, J.c.type, J.c.kind, J.c.state, J.c.group_key, J.c.attempts,
                       J.c.parent_id, J.c.created_at, J.c.finished_at, J.c.error)
                .where(*where).order_by(J.c.id.desc()).limit(limit + 1))).all()
            out = [JobRow(r.id, r.type, r.kind, r.state, r.group_key, r.attempts, r.parent_id,
                          r.created_at, r.finished_at, _err_line(r.error)) for r in rows[:limit]]
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
            ids: list[int] = []
            for p in parts:  # one index range per state
                ids += [r[0] for r in await conn.execute(p)]
            return sorted(ids, reverse=True)

        ids = await self._read(read)
        return ids[:BULK_MAX], _count(len(ids), BULK_MAX)

    # -- one job ----------------------------------------------------------------------------
    async def job(self, job_id: int) -> JobDetail:
        """A job with what its page shows. Raises JobNotFoundError."""
        job = await self.q.get(job_id)
        J, D, W = self.t.jobs, self.t.deps, self.t.workers
        extra = [J.c.checkpoint, J.c.timeout, J.c.attempt_limit, J.c.cancel_requested,
                 J.c.lease_expires]
        optional = [J.c[n] for n in ("progress", "errors") if n in J.c]

        async def read(conn: AsyncConnection) -> JobDetail:
            now = (await conn.execute(select(db_now()))).scalar_one()
            row = (await conn.execute(select(*extra, *optional).where(J.c.id == job_id))).first()
            if row is None:
                raise JobNotFoundError(f"no job with id {job_id}")
            m = row._mapping
            expires = None
            seen = None
            if job.state == JobState.RUNNING and m["lease_expires"] is not None:
                expires = (m["lease_expires"] - now).total_seconds()
                last = await conn.scalar(select(W.c.last_seen).where(W.c.id == job.lease_owner))
                seen = None if last is None else max((now - last).total_seconds(), 0.0)
            children: dict[str, Count] = {}
            if job.is_container:
                for s in STATES:
                    n = await conn.scalar(select(func.count()).select_from(
                        select(literal(1).label("x")).where(J.c.parent_id == job_id,
                                                            J.c.state == lit(s))
                        .limit(CAP + 1).subquery()))
                    if n:
                        children[s] = _count(int(n))
            down = (await conn.execute(
                select(J.c.id, J.c.type, J.c.state).join(D, D.c.job_id == J.c.id)
                .where(D.c.depends_on_id == job_id).order_by(J.c.id).limit(51))).all()
            up = (await conn.execute(
                select(J.c.id, J.c.type, J.c.state).join(D, D.c.depends_on_id == J.c.id)
                .where(D.c.job_id == job_id).order_by(J.c.id).limit(200))).all()
            return JobDetail(
                job, m["checkpoint"], m["timeout"], m["attempt_limit"], expires,
                bool(m["cancel_requested"]), seen,
                getattr(job, "progress", m.get("progress")),
                getattr(job, "errors", m.get("errors")),
                children, [(r.id, r.type, r.state) for r in down[:50]], len(down) > 50,
                [(r.id, r.type, r.state) for r in up], now)

        return await self._read(read)

    # -- the DAG ----------------------------------------------------------------------------
    async def dag(self, job_id: int) -> Graph:
        """The DAG around a job: the whole content of its outermost container (or of the job
        if it is one), its upstream and downstream closures, and the containers of every node
        fetched. Bounded by DAG_FETCH nodes and DAG_CHILDREN children per container."""
        J, D = self.t.jobs, self.t.deps
        cols = (J.c.id, J.c.type, J.c.kind, J.c.state, J.c.parent_id, J.c.group_key)

        async def read(conn: AsyncConnection) -> Graph:
            nodes: dict[int, Node] = {}

            async def fetch(ids: Iterable[int]) -> list[Node]:
                want = sorted(set(ids) - nodes.keys())
                got: list[Node] = []
                for i in range(0, len(want), 500):
                    part = want[i : i + 500]
                    for r in await conn.execute(select(*cols).where(J.c.id.in_(part))):
                        n = Node(r.id, r.type, r.kind, r.state, r.parent_id, r.group_key)
                        nodes[n.id] = n
                        got.append(n)
                return got

            first = await fetch([job_id])
            if not first:
                raise JobNotFoundError(f"no job with id {job_id}")
            root = first[0]
            while root.parent_id is not None and len(nodes) < 64:
                got = await fetch([root.parent_id])
                if not got:
                    break
                root = got[0]
            hidden: dict[int, dict[str, int]] = {}
            expanded: set[int] = set()

            async def expand(level: list[int]) -> None:
                """Containers' content, level by level, a bounded slice per container."""
                while level and len(nodes) < DAG_FETCH:
                    nxt: list[int] = []
                    for cid in level:
                        if cid in expanded:
                            continue
                        expanded.add(cid)
                        kids = (await conn.execute(
                            select(*cols).where(J.c.parent_id == cid).order_by(J.c.id)
                            .limit(DAG_CHILDREN + 1))).all()
                        for r in kids[:DAG_CHILDREN]:
                            if r.id not in nodes:
                                nodes[r.id] = Node(r.id, r.type, r.kind, r.state, r.parent_id,
                                                   r.group_key)
                            if r.kind == S.CONTAINER:
                                nxt.append(r.id)
                        if len(kids) > DAG_CHILDREN:
                            hidden[cid] = await self._hidden(
                                conn, cid, [r.id for r in kids[:DAG_CHILDREN]])
                    level = nxt

            truncated = False
            await expand([root.id] if root.kind == S.CONTAINER else [])
            # The focus job's closures over dependency edges (recursive CTEs, bounded).
            for ids in (await self._closure(conn, job_id, up=True),
                        await self._closure(conn, job_id, up=False)):
                if len(ids) >= DAG_FETCH:
                    truncated = True
                await fetch(ids[: max(DAG_FETCH - len(nodes), 0)])
            # ... and the content of the containers among them
            await expand(sorted(n.id for n in nodes.values() if n.kind == S.CONTAINER))
            # Containers of everything fetched, so each is drawn inside its box.
            missing = {n.parent_id for n in nodes.values()} - nodes.keys() - {None}
            rounds = 0
            while missing and rounds < 16:
                got = await fetch(m for m in missing if m is not None)
                missing = {n.parent_id for n in got} - nodes.keys() - {None}
                rounds += 1
            ids = sorted(nodes)
            edges: list[tuple[int, int]] = []
            for i in range(0, len(ids), 500):
                part = ids[i : i + 500]
                for up, down in await conn.execute(
                    select(D.c.depends_on_id, D.c.job_id).where(D.c.job_id.in_(part))):
                    if up in nodes:
                        edges.append((up, down))
            return Graph(job_id, nodes, edges, hidden, truncated or len(nodes) >= DAG_FETCH)

        return await self._read(read)

    async def _hidden(self, conn: AsyncConnection, cid: int, shown: list[int]) -> dict[str, int]:
        """State counts of a container's children not drawn (capped per state)."""
        J = self.t.jobs
        out: dict[str, int] = {}
        for s in STATES:
            n = await conn.scalar(select(func.count()).select_from(
                select(literal(1).label("x"))
                .where(J.c.parent_id == cid, J.c.state == lit(s), J.c.id.not_in(shown))
                .limit(CAP + 1).subquery()))
            if n:
                out[s] = int(n)
        return out

    async def _closure(self, conn: AsyncConnection, job_id: int, up: bool) -> list[int]:
        """Ids reachable from ``job_id`` over dependency edges (upstream or downstream),
        DAG_FETCH at most."""
        D = self.t.deps
        src, dst = (D.c.job_id, D.c.depends_on_id) if up else (D.c.depends_on_id, D.c.job_id)
        seed = select(dst.label("id")).where(src == job_id).cte("reach", recursive=True)
        step = select(dst.label("id")).join(seed, src == seed.c.id)
        reach = seed.union(step)
        rows = await conn.execute(select(reach.c.id).limit(DAG_FETCH))
        return [r[0] for r in rows]

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
                types = _types(r._mapping.get("types")) if types_col is not None else None
                out.append(WorkerRow(r.id, r.host, r.pid, r.started_at, ago,
                                     int(held.get(r.id, 0)), types, ago <= LIVE_WORKER))
            return out

        return await self._read(read)

    async def schedules(self) -> list[ScheduleRow]:
        """Every schedule with a mark in the database, plus those this process registered."""
        J, M = self.t.jobs, self.t.meta
        known: dict[str, Any] = dict(getattr(self.q, "_schedules", {}) or {})

        async def read(conn: AsyncConnection) -> list[ScheduleRow]:
            marks = dict((await conn.execute(
                select(M.c.name, M.c.value).where(M.c.name.like("cron:%")))).all())
            names = sorted({m[5:] for m in marks} | set(known))
            out = []
            for name in names:
                s = known.get(name)
                iso = marks.get(f"cron:{name}") or None
                last = datetime.fromisoformat(iso.replace("Z", "+00:00")) if iso else None
                state = None
                if last is not None:
                    key = f"cron:{name}:{iso}"
                    # a live slot job is one unique-index probe; a finished one has no
                    # live_key any more (and ``key`` is not indexed)
                    state = await conn.scalar(select(J.c.state).where(J.c.live_key == key))
                    state = state or "finished"
                every = None
                nxt = None
                if s is not None:
                    every = f"every {s.every:g} s" if s.every is not None else f"cron {s.cron}"
                    if last is not None:
                        nxt = s.next_after(last)
                out.append(ScheduleRow(name, s.type if s is not None else None, every, last,
                                       state, nxt))
            return out

        return await self._read(read)


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


# -- helpers --------------------------------------------------------------------------------
async def _first(conn: AsyncConnection, stmt: Any,
                 params: dict[str, Any] | None = None) -> Sequence[Any]:
    row = (await conn.execute(stmt, params or {})).first()
    assert row is not None
    return tuple(row)


def _min_cap(a: int | None, b: int) -> int:
    return b if a is None else min(a, b)


def _err_line(error: Any) -> str | None:
    if not isinstance(error, dict):
        return None
    line = f"{error.get('type', '')}: {error.get('message', '')}".strip(": ")
    return line[:160] or None


def _types(v: Any) -> list[str] | None:
    if v is None:
        return None
    if isinstance(v, str):
        import json

        try:
            v = json.loads(v)
        except ValueError:
            return [t for t in v.split(",") if t]
    return [str(t) for t in v] if isinstance(v, (list, tuple)) else None


def group_states(nodes: Iterable[Node]) -> dict[str, int]:
    """How many nodes are in each state."""
    out: dict[str, int] = defaultdict(int)
    for n in nodes:
        out[n.state] += 1
    return dict(out)


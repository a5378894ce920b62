"""Prometheus metrics (``pip install "aiojobqueue[prometheus]"``).

``register(queue)`` exports, from this process's worker (via the lifecycle hooks):

* ``aiojobqueue_jobs_finished_total{type,group,outcome}``: jobs that ended while running
  here: ``done``, ``failed`` (for good) or ``cancelled``; an attempt whose worker died is
  counted by the worker that reclaimed it;
* ``aiojobqueue_job_retries_total{type,group}``: failed attempts that will run again;
* ``aiojobqueue_job_run_seconds{type}``: how long each attempt ran (histogram);
* ``aiojobqueue_job_wait_seconds{type}``: from the moment a job became runnable (its
  ``run_after``, its last dependency finishing, or its container's) to its start;

and, read from the database at scrape time (fleet-wide, cached ``cache_seconds``):

* ``aiojobqueue_jobs{state,group}``: jobs ``ready``, ``running``, ``scheduled`` and
  ``waiting`` per group. Each count is one index range (the partial state indexes, among
  them ``ix_waiting_group`` for waiting jobs,
  schema.overview_indexes; on MySQL/MariaDB the leading (state, group_key) of
  a state index, which indexes every row there), so its cost follows the live jobs of that
  state, never the finished ones;
* ``aiojobqueue_workers``: live workers (heartbeat younger than ``lease_ttl``).

A scrape runs in the HTTP server's thread; the database is the queue's, whose connections
belong to its event loop, so the read is handed to that loop and waited for (at most
``timeout`` seconds; past that, or if the loop is gone, the last counts are served). A
scrape from inside the loop itself (an ASGI route calling ``generate_latest``) cannot wait
on it: it gets the cached counts and schedules a refresh.

Cost: with no metrics registered, nothing. Registered: a hook call per attempt start and
end (a counter and a histogram update), and one read per second at most (batched) of the
started jobs' times for the wait histogram.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Iterable
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .errors import ConfigurationError
from .hooks import JobEvent
from .logs import brief
from .sql import chunks, in_state
from .timeutil import utcnow_plus

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from .core import Core
    from .database import Database
    from .queue import JobQueue
    from .settings import Settings

log = logging.getLogger("aiojobqueue.metrics")

#: Buckets for both histograms, seconds: jobs here run from milliseconds to hours.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
           120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, float("inf"))
#: The states the ``aiojobqueue_jobs`` gauge counts (see the module docstring).
GAUGE_STATES = (S.READY, S.RUNNING, S.LEASED, S.SCHEDULED, S.WAITING)
#: Started jobs' times are read in one batch at most this often (for the wait histogram).
WAIT_EVERY = 1.0


def gauge_queries(tables: S.Tables) -> list[tuple[str, Any]]:
    """(state, statement) per counted state: ``group_key, count(*)`` of that state. The
    state is a literal, as in the partial indexes' predicates, so a plan can use them;
    waiting jobs with all of ``ix_waiting_group``'s predicate (sql.in_state)."""
    J = tables.jobs
    return [(state, select(J.c.group_key, func.count()).where(*in_state(J, state))
             .group_by(J.c.group_key)) for state in GAUGE_STATES]


class QueueMetrics:
    """The collectors of one queue (what ``register`` returns). It keeps the queue, not its
    parts: it may be registered before the queue starts, and reads through the started
    queue's ``Core`` whenever it reads."""

    def __init__(self, q: JobQueue, registry: CollectorRegistry, cache_seconds: float,
                 timeout: float) -> None:
        self.q = q
        self.registry = registry
        self.cache_seconds = cache_seconds
        self.timeout = timeout
        self.finished = Counter(
            "aiojobqueue_jobs_finished", "Jobs that ended while running in this process",
            ["type", "group", "outcome"], registry=registry)
        self.retries = Counter(
            "aiojobqueue_job_retries", "Failed attempts that will run again",
            ["type", "group"], registry=registry)
        self.run_seconds = Histogram(
            "aiojobqueue_job_run_seconds", "How long each attempt ran", ["type"],
            buckets=BUCKETS, registry=registry)
        self.wait_seconds = Histogram(
            "aiojobqueue_job_wait_seconds", "From runnable (ready) to started", ["type"],
            buckets=BUCKETS, registry=registry)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._counts: dict[tuple[str, str], int] = {}
        self._workers = 0
        self._read_at = -float("inf")  # monotonic time of the last database read
        self._refreshing: asyncio.Future[None] | None = None
        self._lock = threading.Lock()
        self._started: list[int] = []
        self._children: dict[tuple[str, str, str], Any] = {}
        self._run_by_type: dict[str, Any] = {}
        self._timing: asyncio.Task[None] | None = None
        self._bind()
        registry.register(_Gauges(self))
        for event in ("done", "failed", "cancelled", "retry"):
            q.on(event, self._ended)
        q.on("start", self._start)

    def _core(self) -> Core | None:
        """The started queue's parts, or None while it is not started (or closed)."""
        try:
            return self.q._started()
        except ConfigurationError:
            return None

    # -- hooks (on the queue's loop) ------------------------------------------------------
    def _bind(self) -> None:
        """Remember the loop the queue runs on (called from it)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if loop is not self._loop:
            self._loop, self._loop_thread = loop, threading.get_ident()

    def _ended(self, ev: JobEvent) -> None:
        # The labelled children are cached: .labels() takes a lock and builds a key per call.
        key = (ev.event, ev.type, ev.group)
        count = self._children.get(key)
        if count is None:
            count = self._children[key] = (
                self.retries.labels(ev.type, ev.group) if ev.event == "retry"
                else self.finished.labels(ev.type, ev.group, ev.event))
        count.inc()
        if ev.duration is not None:
            run = self._run_by_type.get(ev.type)
            if run is None:
                run = self._run_by_type[ev.type] = self.run_seconds.labels(ev.type)
            run.observe(ev.duration)

    def _start(self, ev: JobEvent) -> None:
        self._bind()
        self._started.append(ev.job_id)
        if self._timing is None or self._timing.done():
            self._timing = asyncio.get_running_loop().create_task(self._time_starts())

    async def _time_starts(self) -> None:
        """Observe the wait of the jobs started meanwhile: one batched read a second."""
        while self._started:
            await asyncio.sleep(WAIT_EVERY)
            ids, self._started = self._started, []
            core = self._core()
            if core is None:  # the queue closed meanwhile
                self._started.clear()
                return
            try:
                waits = await core.db.read(partial(_waits, core.db, ids=ids))
            except Exception as exc:  # a missed observation, not a missed job
                log.warning("could not read start times for the wait metric (%s)", brief(exc))
                continue
            for job_type, secs in waits:
                self.wait_seconds.labels(job_type).observe(secs)

    # -- the gauges (any thread) ----------------------------------------------------------
    def gauges(self) -> tuple[dict[tuple[str, str], int], int]:
        """((state, group) -> count, live workers), read at most every cache_seconds."""
        if time.monotonic() - self._read_at >= self.cache_seconds:
            self._refresh()
        with self._lock:
            return dict(self._counts), self._workers

    def _refresh(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed() or not loop.is_running():
            return
        if threading.get_ident() == self._loop_thread:
            # on the loop itself: waiting here would block the read; refresh for next time
            if self._refreshing is None or self._refreshing.done():
                self._refreshing = asyncio.ensure_future(self._read_quietly())
            return
        fut = asyncio.run_coroutine_threadsafe(self._read(), loop)
        try:
            fut.result(self.timeout)
        except Exception as exc:  # the last counts are served
            fut.cancel()
            log.warning("metrics: could not read job counts (%s); serving the last ones",
                        brief(exc) if str(exc) else type(exc).__name__)

    async def _read_quietly(self) -> None:
        try:
            await self._read()
        except Exception as exc:
            log.warning("metrics: could not read job counts (%s)", brief(exc))

    async def _read(self) -> None:
        core = self._core()
        if core is None:  # not started (or closed): the last counts are served
            return
        counts, workers = await read_gauges(core.settings, core.db)
        with self._lock:
            self._counts, self._workers = counts, workers
            self._read_at = time.monotonic()


async def read_gauges(s: Settings, db: Database) -> tuple[dict[tuple[str, str], int], int]:
    """((state, group) -> count, live workers), read from the database in one transaction."""

    async def read(conn: AsyncConnection) -> tuple[dict[tuple[str, str], int], int]:
        counts: dict[tuple[str, str], int] = {}
        for state, stmt in gauge_queries(db.t):
            for group, n in await conn.execute(stmt):
                counts[(state, group)] = int(n)
        W = db.t.workers
        live = await conn.scalar(select(func.count()).select_from(W)
                                 .where(W.c.last_seen >= utcnow_plus(-s.lease_ttl)))
        return counts, int(live or 0)

    return await db.read(read)


async def _waits(db: Database, conn: AsyncConnection, *, ids: list[int]
                 ) -> list[tuple[str, float]]:
    """(type, seconds from runnable to started) of the jobs ``ids``. Runnable: the latest of
    its ``run_after`` and the finish of the last dependency of it or of its containers."""
    J, D = db.t.jobs, db.t.deps
    rows: list[Any] = []
    for part in chunks(ids):
        rows += (await conn.execute(
            select(J.c.id, J.c.type, J.c.started_at, J.c.run_after, J.c.parent_id)
            .where(J.c.id.in_(part), J.c.started_at.is_not(None)))).all()
    parent: dict[int, int | None] = {r.id: r.parent_id for r in rows}
    todo = {p for p in parent.values() if p is not None}
    while todo:  # the containers up the tree (most jobs have none: no query)
        found = (await conn.execute(select(J.c.id, J.c.parent_id)
                                    .where(J.c.id.in_(sorted(todo))))).all()
        parent.update({r.id: r.parent_id for r in found})
        todo = {r.parent_id for r in found if r.parent_id is not None} - parent.keys()
    last: dict[int, datetime] = {}
    nodes = sorted(parent)
    up = J.alias("up")
    for part in chunks(nodes):
        for jid, at in await conn.execute(
                select(D.c.job_id, func.max(up.c.finished_at))
                .join(up, up.c.id == D.c.depends_on_id)
                .where(D.c.job_id.in_(part)).group_by(D.c.job_id)):
            if at is not None:
                last[jid] = at
    out = []
    for r in rows:
        ready = r.run_after
        node: int | None = r.id
        while node is not None:
            at = last.get(node)
            if at is not None and at > ready:
                ready = at
            node = parent.get(node)
        out.append((r.type, max((r.started_at - ready).total_seconds(), 0.0)))
    return out


class _Gauges(Collector):
    """``aiojobqueue_jobs`` and ``aiojobqueue_workers``, read on scrape."""

    def __init__(self, m: QueueMetrics) -> None:
        self.m = m

    def describe(self) -> Iterable[Metric]:
        # registering must not read the database (it may run before the loop does)
        return [_jobs_family(), _workers_family()]

    def collect(self) -> Iterable[Metric]:
        counts, workers = self.m.gauges()
        jobs = _jobs_family()
        for (state, group), n in sorted(counts.items()):
            jobs.add_metric([state, group], n)
        live = _workers_family()
        live.add_metric([], workers)
        return [jobs, live]


def _jobs_family() -> GaugeMetricFamily:
    return GaugeMetricFamily("aiojobqueue_jobs", "Jobs ready, running, leased (held ahead), "
                             "scheduled and waiting, "
                             "per group (the whole database)", labels=["state", "group"])


def _workers_family() -> GaugeMetricFamily:
    return GaugeMetricFamily("aiojobqueue_workers", "Live workers on the database")


def register(queue: JobQueue, registry: CollectorRegistry | None = None, *,
             cache_seconds: float = 5.0, timeout: float = 5.0) -> QueueMetrics:
    """Export ``queue``'s metrics to ``registry`` (default: prometheus_client's global one).

    Call it once per queue, before ``serve()`` (the counters and histograms come from the
    hooks of attempts run from then on), best on the queue's event loop: the database
    gauges read through that loop, which is otherwise only known once a job starts."""
    return QueueMetrics(queue, REGISTRY if registry is None else registry,
                        cache_seconds, timeout)


def serve_metrics(queue: JobQueue, port: int, addr: str = "0.0.0.0",
                  registry: CollectorRegistry | None = None) -> tuple[WSGIServer, QueueMetrics]:
    """``register(queue, registry)`` and serve ``/metrics`` (any path, in fact) on
    ``addr:port`` from a daemon thread: the command line's ``worker --metrics-port``. Call
    it on the queue's event loop. ``server.shutdown()`` stops it."""
    reg = REGISTRY if registry is None else registry
    metrics = register(queue, reg)
    server, _thread = start_http_server(port, addr=addr, registry=reg)
    return server, metrics

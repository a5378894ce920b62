"""JobQueue: the facade. Configuration and registration (a handler's rules are
handlers.py's), lifecycle (core.py opens and builds the parts, and takes them down),
enqueue, serve. Its methods on one job are jobmethods.py's (get, explain, wait, cancel,
retry), the policy and schedule methods operations.py's, the external steps' workflowapi.py's."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import datetime, timedelta
from functools import partial
from types import TracebackType
from typing import Any, Generic, ParamSpec, TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from . import schedules as schedule_ops
from . import schema as S
from .batch import Batch, JobRef
from .core import Core, close_core, open_core
from .debounce import enqueue as debounced
from .dialects.urls import async_url, listen_url_for
from .errors import (
    ConfigurationError,
    NotStartedError,
)
from .executor import JobContext
from .handlers import Handler, HandlerSpec, Register, RetryOn, registrar
from .hooks import Hooks
from .insert import Inserter
from .jobmethods import JobMethods
from .limits import Limit
from .operations import Operations
from .periodic import Clock, Schedule, make_schedule
from .retention import check_retention, declare
from .settings import DEFAULT_POOL_SIZE, Settings
from .worker import Worker
from .workflowapi import ExternalSteps

log = logging.getLogger("aiojobqueue")
T = TypeVar("T")
V = TypeVar("V")
P = ParamSpec("P")
R = TypeVar("R")

_NOT_STARTED = ("the queue is not started: open it with `async with queue:` (or "
                "`await queue.start()`) before using the database")


class _Setting(Generic[V]):
    """A public setting of JobQueue: read from its Settings; set (before start) by building
    new Settings, validated again."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, q: JobQueue | None, owner: type) -> V:
        if q is None:  # on the class (introspection): the descriptor itself
            return self  # type: ignore[return-value]
        return getattr(q._settings, self.name)  # type: ignore[no-any-return]

    def __set__(self, q: JobQueue, value: V) -> None:
        if q._core is not None:
            raise ConfigurationError(f"{self.name} cannot change once the queue has started")
        q._settings = q._settings.replace(**{self.name: value})
        if self.name == "prefix":
            q._t = S.build_tables(q._settings.prefix)


class JobQueue(JobMethods, ExternalSteps, Operations):
    """A DAG job queue whose only state is your database.

    ``url`` is a SQLAlchemy URL (``sqlite:///jobs.db``, ``postgresql://…``, ``mysql://…``;
    a URL naming no driver gets its async one: aiosqlite, asyncpg, aiomysql) or an
    ``AsyncEngine``.
    ``concurrency`` caps jobs in flight across every worker on the database (None: no global
    cap); ``capacity`` caps jobs in flight in this process. See the README for the rest.

    ``pool_size`` bounds the connections of the engine built from ``url`` (no overflow: the
    process never holds more, and none is opened and closed per burst). On
    PostgreSQL a serving worker holds one more, for LISTEN, opened to ``listen_url`` where
    given: a direct connection when ``url`` goes through a transaction pooler such as
    PgBouncer (see docs/deploying.md). ``retention``: per state, see docs/operations.md.
    """

    def __init__(
        self,
        url: str | AsyncEngine,
        *,
        concurrency: int | None = None,
        capacity: int = 10,
        limits: Iterable[Limit] = (),
        group_limits: dict[str, int] | None = None,
        lease_ttl: float = 30.0,
        heartbeat_interval: float = 10.0,
        poll_interval: float = 1.0,
        shutdown_timeout: float = 30.0,
        prefix: str = S.DEFAULT_PREFIX,
        max_attempts: int = 3,
        retry_backoff: float = 1.0,
        retry_backoff_max: float = 300.0,
        default_group: str = "default",
        worker_id: str | None = None,
        pool_size: int = DEFAULT_POOL_SIZE,
        listen_url: str | None = None,
        retention: Mapping[str, timedelta] | None = None,
    ) -> None:
        if isinstance(url, AsyncEngine) and pool_size != DEFAULT_POOL_SIZE:
            raise ConfigurationError(
                "pool_size applies to the engine aiojobqueue builds from a URL; size the "
                "pool of a ready-made engine where you create it")
        self._settings = Settings.build(
            limits, group_limits, concurrency=concurrency, capacity=capacity,
            lease_ttl=lease_ttl, heartbeat_interval=heartbeat_interval,
            poll_interval=poll_interval, shutdown_timeout=shutdown_timeout, prefix=prefix,
            max_attempts=max_attempts, retry_backoff=retry_backoff,
            retry_backoff_max=retry_backoff_max, default_group=default_group,
            worker_id=worker_id or "", pool_size=pool_size,
            listen_url=listen_url_for(url, listen_url),
        )
        self._retention = None if retention is None else check_retention(retention)
        self._url = async_url(url) if isinstance(url, str) else url
        self._t = S.build_tables(prefix)
        self._handlers: dict[str, HandlerSpec] = {}
        self._hooks = Hooks()
        self._schedules: dict[str, Schedule] = {}
        self._schedule_clock: Clock | None = None
        #: the parts of the started queue (None until start())
        self._core: Core | None = None
        self._inserter: Inserter | None = None
        self._worker: Worker | None = None

    concurrency: _Setting[int | None] = _Setting()
    capacity: _Setting[int] = _Setting()
    lease_ttl: _Setting[float] = _Setting()
    heartbeat_interval: _Setting[float] = _Setting()
    poll_interval: _Setting[float] = _Setting()
    shutdown_timeout: _Setting[float] = _Setting()
    prefix: _Setting[str] = _Setting()
    max_attempts: _Setting[int] = _Setting()
    retry_backoff: _Setting[float] = _Setting()
    retry_backoff_max: _Setting[float] = _Setting()
    default_group: _Setting[str] = _Setting()
    worker_id: _Setting[str] = _Setting()
    pool_size: _Setting[int] = _Setting()

    @property
    def limits(self) -> list[Limit]:
        """The limits on how many jobs may start (see ``aiojobqueue.limits``)."""
        return list(self._settings.limits)

    @property
    def group_limits(self) -> dict[str, int]:
        """The most jobs of a group in flight at once, fleet-wide, by group."""
        return dict(self._settings.group_limits)

    @property
    def settings(self) -> Settings:
        """This queue's configuration, frozen."""
        return self._settings

    # -- registration ---------------------------------------------------------------------
    def handler(
        self,
        type: str,
        *,
        timeout: float | None = None,
        max_attempts: int | None = None,
        retry_on: RetryOn = Exception,
    ) -> Register:
        """Register ``async def fn(ctx, **args)`` as the handler of jobs of ``type`` (or a
        plain ``def fn(ctx, **args)``: it runs in a worker thread, at most ``capacity`` at
        once, with a synchronous ``ctx``: see threads.ThreadContext).

        ``timeout`` and ``max_attempts`` are the type's defaults (an enqueue may override
        them). ``retry_on``: the exception classes worth another attempt (default: every
        Exception); any other exception, and a ``PermanentError``, fails the job for good at
        once. A timeout and a lost lease always count as retryable attempts.

        Returns a ``Handler``: still the coroutine function, with ``.enqueue(args, ...)``.
        Enqueues of this type from this queue check their args against ``fn``'s signature.
        """
        return registrar(type, timeout, max_attempts, retry_on, self._handlers, self.enqueue)

    def periodic(
        self,
        name: str,
        *,
        type: str,
        args: dict[str, Any] | None = None,
        every: timedelta | float | None = None,
        cron: str | None = None,
        tz: str | None = None,
        **options: Any,
    ) -> None:
        """Enqueue a ``type`` job once per slot, across every worker serving this database.

        Give ``every`` (a timedelta or seconds; slots aligned to the Unix epoch, UTC) or
        ``cron`` (a 5-field cron expression, in the IANA time zone ``tz``, default UTC: a
        wall time skipped by daylight saving is no slot, one that repeats is one slot).
        ``options`` are enqueue options: group, weight, priority, timeout, max_attempts.
        start() declares the schedule into the schedules table (where it differs); serve()
        runs it; each slot is enqueued exactly once even with many workers (see
        ``aiojobqueue.periodic`` and ``aiojobqueue.schedules``).
        """
        if name in self._schedules:
            raise ConfigurationError(f"a schedule named {name!r} is already registered")
        sched = make_schedule(name, type=type, args=args, every=every, cron=cron, tz=tz,
                              **options)
        self.batch().add(sched.type, sched.args, **sched.options)  # bad options fail now
        self._schedules[name] = sched

    def on(self, event: str, fn: Callable[..., Any]) -> None:
        """Call ``fn(event: JobEvent)`` on a lifecycle event of an attempt: start, done, retry,
        failed (for good), cancelled, released (by shutdown) or discarded (fenced out).
        See ``aiojobqueue.hooks`` for what each means."""
        self._hooks.add(event, fn)

    # -- lifecycle ------------------------------------------------------------------------
    async def __aenter__(self) -> JobQueue:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start(self, *, migrate: bool = True) -> None:
        """Connect and create or upgrade the schema. Idempotent.

        ``migrate=False`` creates nothing: it raises SchemaError unless the schema is there
        and current (for read-only tools such as ``aiojobqueue status``)."""
        if self._core is not None:
            return
        s = self._settings
        self._core, self._inserter = await open_core(
            self._url, s, self._t, migrate=migrate, hooks=self._hooks,
            handlers=self._handlers, schedules=self._schedules,
            # (a partial: no Python frame per job)
            make_context=lambda db: partial(JobContext, self, db, s.worker_id),
            batch_on=lambda conn: self.batch(connection=conn))
        try:
            await schedule_ops.on_start(self._core, self._schedule_clock, declare=migrate)
        except BaseException:  # a start that fails leaves nothing open
            core, self._core = self._core, None
            await close_core(core)
            raise
        if self._retention is not None and migrate:
            await declare(self._core.db, self._retention)

    async def close(self) -> None:
        """Dispose of the engine aiojobqueue created (a passed-in engine is left alone)."""
        core, self._core = self._core, None
        if core is not None:
            await close_core(core)

    @property
    def engine(self) -> AsyncEngine:
        """The started queue's engine (raises NotStartedError before ``start()``)."""
        return self._started().db.engine

    def _started(self) -> Core:
        if self._core is None:
            raise NotStartedError(_NOT_STARTED)
        return self._core

    # -- transactions, for the operator tools (admin.py) ----------------------------------
    async def _write(self, fn: Callable[[AsyncConnection], Awaitable[T]], retries: int = 8) -> T:
        """Database.write on this queue's database."""
        return await self._started().db.write(fn, retries)

    async def _read(self, fn: Callable[[AsyncConnection], Awaitable[T]], retries: int = 3) -> T:
        """Database.read on this queue's database."""
        return await self._started().db.read(fn, retries)

    # -- enqueue --------------------------------------------------------------------------
    def batch(self, connection: AsyncConnection | AsyncSession | None = None) -> Batch:
        """Collect jobs and containers to insert as one DAG in one transaction."""
        return Batch(self._settings, self._handlers, self._insert, connection)

    async def _insert(self, specs: list[Any],
                      connection: AsyncConnection | AsyncSession | None) -> list[int]:
        self._started()
        assert self._inserter is not None
        return await self._inserter.insert(specs, connection)

    async def enqueue(
        self,
        type: str | Handler[..., Any],
        args: dict[str, Any] | None = None,
        *,
        group: str | None = None,
        weight: int | None = None,
        depends_on: Iterable[JobRef | int] = (),
        run_after: timedelta | datetime | float | None = None,
        priority: int = 0,
        timeout: float | None = None,
        max_attempts: int | None = None,
        key: str | None = None,
        parent: JobRef | int | None = None,
        debounce: timedelta | float | None = None,
        debounce_max: timedelta | float | None = None,
        when: str = "done",
        tags: Iterable[str] | None = None,
    ) -> int:
        """Enqueue one job and return its id (with a live ``key``: the existing job's id).

        ``type`` is a job type or a ``Handler``; where this process knows the handler, the
        args must fit its signature (else InvalidJobError, and nothing is inserted). A type
        with no handler here is accepted: another process may serve it. Options are those
        of ``Batch.add``, which returns a JobRef instead: inside a batch the id exists only
        once the batch has been inserted (``ref.id``); ``when``: the run condition (see
        ``Batch.add``). ``debounce`` (with ``key``): while
        the keyed job has not started, a later enqueue replaces its args and moves its run
        to now + debounce, never past its first enqueue + ``debounce_max`` (debounce.py)."""
        if debounce is not None:
            return await debounced(self, type, args, key, debounce, debounce_max, dict(
                group=group, weight=weight, depends_on=depends_on, run_after=run_after,
                priority=priority, timeout=timeout, max_attempts=max_attempts, parent=parent,
                when=when, tags=tags))
        b = self.batch()
        ref = b.add(type, args, group=group, weight=weight, depends_on=depends_on,
                    run_after=run_after, priority=priority, timeout=timeout,
                    max_attempts=max_attempts, key=key, parent=parent, when=when, tags=tags)
        await b.commit()
        return ref.id

    def schedule_clock(self, clock: Clock | None) -> None:
        """Read the schedules' time from ``await clock()`` (an aware datetime) instead of
        the database's clock, from the next start() on: for tests that cross a daylight-
        saving change. Every worker of a database should agree on the time."""
        self._schedule_clock = clock

    # -- serving --------------------------------------------------------------------------
    async def serve(self) -> None:
        """Run jobs until cancelled; on cancellation shut down gracefully."""
        await self.start()
        self._worker = Worker(self._started())
        try:
            await self._worker.serve()
        finally:
            self._worker = None

    async def run_until_idle(self) -> None:
        """Run jobs until nothing this process can run is runnable and nothing is in flight
        anywhere (retries in backoff count as in flight; jobs delayed by run_after do not)."""
        await self.start()
        self._worker = Worker(self._started())
        try:
            await self._worker.serve(until_idle=True)
        finally:
            self._worker = None


"""JobQueue: configuration, lifecycle, enqueue/get/wait/cancel/retry, serve."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, TypeVar

from sqlalchemy import Connection, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, create_async_engine

from . import history, progress
from . import schema as S
from .batch import BULK_ROWS, MAX_ID, Batch, JobRef, _Spec, insert_alone, insert_specs
from .completer import SPLIT, Completer
from .dialects.base import DialectOps, dialect_for, engine_kwargs_for
from .errors import (
    ConfigurationError,
    JobCancelled,
    JobFailed,
    JobNotFoundError,
)
from .executor import Handler, HandlerSpec
from .explain import Explanation, explain
from .hooks import Hooks
from .limits import Limit, RateLimit, check_limits
from .models import Job, JobState
from .periodic import Schedule, make_schedule
from .worker import Worker

log = logging.getLogger("aiojobqueue")
T = TypeVar("T")


class JobQueue:
    """A DAG job queue whose only state is your database.

    ``url`` is a SQLAlchemy async URL (``sqlite+aiosqlite:///jobs.db``,
    ``postgresql+asyncpg://…``, ``mysql+aiomysql://…``) or an ``AsyncEngine``.
    ``concurrency`` caps jobs in flight across every worker on the database (None: no global
    cap); ``capacity`` caps jobs in flight in this process. See the README for the rest.
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
    ) -> None:
        if concurrency is not None and (not isinstance(concurrency, int) or concurrency < 1):
            raise ConfigurationError(f"concurrency must be an int >= 1 or None: {concurrency!r}")
        if not isinstance(capacity, int) or capacity < 1:
            raise ConfigurationError(f"capacity must be an int >= 1: {capacity!r}")
        if heartbeat_interval <= 0 or poll_interval <= 0 or shutdown_timeout < 0:
            raise ConfigurationError("heartbeat_interval and poll_interval must be > 0")
        if lease_ttl < 2 * heartbeat_interval:
            raise ConfigurationError(
                f"lease_ttl ({lease_ttl}s) must be at least twice heartbeat_interval "
                f"({heartbeat_interval}s), or a live job's lease can expire between heartbeats"
            )
        if not prefix.replace("_", "").isalnum() or len(prefix) > 20:
            raise ConfigurationError(f"prefix must be letters, digits and _ (<= 20): {prefix!r}")
        for g, n in (group_limits or {}).items():
            if not isinstance(n, int) or n < 0:
                raise ConfigurationError(f"group limit for {g!r} must be an int >= 0: {n!r}")
        self._url = url
        self.concurrency = concurrency
        self.capacity = capacity
        self.limits = list(limits)
        check_limits(self.limits)
        self.group_limits = dict(group_limits or {})
        self.lease_ttl = float(lease_ttl)
        self.heartbeat_interval = float(heartbeat_interval)
        self.poll_interval = float(poll_interval)
        self.shutdown_timeout = float(shutdown_timeout)
        self.prefix = prefix
        self.max_attempts = max_attempts
        self.retry_backoff = retry_backoff
        self.retry_backoff_max = retry_backoff_max
        self.default_group = default_group
        self.worker_id = worker_id or f"{uuid.uuid4().hex[:12]}"
        self._t = S.build_tables(prefix)
        self._handlers: dict[str, HandlerSpec] = {}
        self._hooks = Hooks()
        self._engine: AsyncEngine | None = None
        self._owns_engine = False
        self._ops: DialectOps = None  # type: ignore[assignment]
        self._completer = Completer(self)
        self._known_groups: set[str] = set()
        self._promoted_at = 0.0  # monotonic time of this process's last promotion sweep
        self._groups_at = 0.0  # ... and of its last census of groups with runnable jobs
        self._census_due = False  # a claim left the census to the next one (see claim())
        self._single_group: str | None = None  # the only such group then, if just one
        # Hot statements built once (claim, finalize): no per-round construction and one
        # compiled form each; keyed by their role and shape.
        self._stmts: dict[Any, Any] = {}
        #: the calls of the one-call finalize and release routines, where installed
        self._settle_call: Any | None = None
        self._release_call: Any | None = None
        self._rest_call: Any | None = None
        #: see completer.SPLIT (tests lower it to split small fan-outs)
        self._split = SPLIT
        #: the calls releasing the rest of split releases, in flight (held: tasks are weak)
        self._resting: set[asyncio.Task[Any]] = set()
        # Tests force the no-RETURNING insert path (MySQL 8) on MariaDB with this.
        self._force_insert_fallback = False
        self._local_done = asyncio.Event()
        self._worker: Worker | None = None
        self._schedules: dict[str, Schedule] = {}
        self._db_limits = [lim for lim in self.limits if isinstance(lim, RateLimit)]
        self._local_limits = [lim for lim in self.limits if not isinstance(lim, RateLimit)]
        for lim in self._db_limits:
            lim._queue = self
        self._needs_gate = bool(concurrency is not None or self.group_limits or self._db_limits)

    # -- registration ---------------------------------------------------------------------
    def handler(
        self, type: str, *, timeout: float | None = None, max_attempts: int | None = None
    ) -> Callable[[Handler], Handler]:
        """Register ``async def fn(ctx, **args)`` as the handler of jobs of ``type``."""
        if timeout is not None and timeout <= 0:
            raise ConfigurationError(f"timeout must be > 0: {timeout!r}")
        if max_attempts is not None and max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be >= 1: {max_attempts!r}")

        def register(fn: Handler) -> Handler:
            if not asyncio.iscoroutinefunction(fn):
                raise ConfigurationError(f"handler for {type!r} must be an async function")
            self._handlers[type] = HandlerSpec(fn, timeout, max_attempts)
            return fn

        return register

    def periodic(
        self,
        name: str,
        *,
        type: str,
        args: dict[str, Any] | None = None,
        every: timedelta | float | None = None,
        cron: str | None = None,
        **options: Any,
    ) -> None:
        """Enqueue a ``type`` job once per slot, across every worker serving this database.

        Give ``every`` (a timedelta or seconds; slots aligned to the Unix epoch, UTC) or
        ``cron`` (a 5-field cron expression, UTC). ``options`` are enqueue options: group,
        weight, priority, timeout, max_attempts. serve() runs the schedules; each slot is
        enqueued exactly once even with many workers (see ``aiojobqueue.periodic``).
        """
        if name in self._schedules:
            raise ConfigurationError(f"a schedule named {name!r} is already registered")
        sched = make_schedule(name, type=type, args=args, every=every, cron=cron, **options)
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
        if self._engine is not None:
            return
        if isinstance(self._url, AsyncEngine):
            engine = self._url
        else:
            url = make_url(self._url)
            if url.get_backend_name() in ("mysql", "mariadb") and "charset" not in url.query:
                url = url.update_query_dict({"charset": "utf8mb4"})
            engine = create_async_engine(url, **engine_kwargs_for(url.drivername))
            self._owns_engine = True
        ops = dialect_for(engine, self._t)
        self._engine = ops.prepare_engine(engine)
        self._ops = ops
        try:
            from .migrate import check, settle_routine, upgrade

            await (upgrade(self) if migrate else check(self))
            calls = await settle_routine(self, create=migrate)
            self._settle_call, self._release_call, self._rest_call = calls or (None,) * 3
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Dispose of the engine aiojobqueue created (a passed-in engine is left alone)."""
        if self._resting:  # split releases in flight land first (a part left: a sweep's)
            _, late = await asyncio.wait(list(self._resting), timeout=5.0)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=1.0)
        engine, self._engine = self._engine, None
        if engine is not None:
            await self._ops.release()
        if engine is not None and self._owns_engine:
            await engine.dispose()

    @property
    def engine(self) -> AsyncEngine:
        if self._engine is None:
            raise ConfigurationError("the queue is not started: use `async with queue:` first")
        return self._engine

    # -- split releases -------------------------------------------------------------------
    def _release_rest(self) -> None:
        """A finalize just split the release of a wide fan-out (see completer.SPLIT): release
        the rest at once, on a connection of its own, while the first of its jobs run. Not
        awaited: if it fails, the row it would have taken is left to a sweep
        (Worker._reclaim_loop), as if this process had died."""
        task = asyncio.get_running_loop().create_task(self._rest_releases())
        self._resting.add(task)
        task.add_done_callback(self._resting.discard)

    async def _rest_releases(self, n: int = 64) -> int:
        """Release up to ``n`` recorded parts of split releases (any worker's: parts taken by
        a call in flight are skipped), one transaction each, in order, waking the local
        worker as each lands. Returns how many were released."""
        stmt = self._rest_call
        done = 0
        while stmt is not None and done < n:
            try:
                took = await self._autocommit(lambda conn: conn.scalar(stmt, {"n": 1}))
            except Exception as exc:  # the part stays; a sweep takes it
                log.warning("releasing the rest of a wide fan-out failed (%s); a sweep "
                            "will", exc)
                break
            if not took:
                break
            done += 1
            if self._worker is not None:
                self._worker.wake.set()
        return done

    # -- transactions ---------------------------------------------------------------------
    async def _write(self, fn: Callable[[AsyncConnection], Awaitable[T]], retries: int = 8) -> T:
        """Run ``fn`` in one write transaction; lock conflicts and deadlocks retry it whole."""

        async def once() -> T:
            async with self.engine.begin() as conn:
                return await fn(conn)

        return await self._retrying(once, retries)

    async def _write_sync(self, fn: Callable[[Connection], T], retries: int = 8) -> T:
        """``_write()`` for a synchronous ``fn``. Where the dialect has a side writer (SQLite)
        the transaction runs wholly in a thread on a connection of its own: once it holds
        the database's write lock it commits and lets go even while a handler blocks this
        event loop, so other processes' writes never wait on it. For the side loops' short
        transactions (the heartbeat), not the hot path."""
        side = self._ops.side_writer(self.engine)
        if side is None:
            return await self._write(lambda conn: conn.run_sync(fn), retries)

        def once() -> T:
            with side.begin() as conn:
                return fn(conn)

        return await self._retrying(lambda: asyncio.to_thread(once), retries)

    async def _retrying(self, once: Callable[[], Awaitable[T]], retries: int) -> T:
        """``once()``, again on a lock conflict or deadlock, up to ``retries`` times."""
        delay = 0.005
        for attempt in range(retries + 1):
            try:
                return await once()
            except Exception as exc:  # drivers may raise unwrapped errors: ask the dialect
                if attempt == retries or not self._ops.is_transient(exc):
                    raise
                await asyncio.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 1.0)
        raise AssertionError("unreachable")

    async def _autocommit(self, fn: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """Run ``fn`` on a connection in autocommit: each statement commits by itself, so
        ``fn`` must only issue statements that are atomic on their own. Not retried: the
        caller decides (a lost answer may hide a commit)."""
        async with self.engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            return await fn(conn)

    async def _read(self, fn: Callable[[AsyncConnection], Awaitable[T]], retries: int = 3) -> T:
        """Run a read-only ``fn``; a pooled connection that died (a database restart) or a
        lock conflict is retried on a fresh one, since reading twice is harmless."""
        delay = 0.005
        for attempt in range(retries + 1):
            try:
                async with self.engine.connect() as conn:
                    ro = self._ops.read_only(conn)
                    if ro is not None:
                        conn = await ro
                    return await fn(conn)
            except Exception as exc:
                if attempt == retries or not self._ops.is_transient(exc):
                    raise
                await asyncio.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 1.0)
        raise AssertionError("unreachable")

    async def _ensure_groups(self, conn: AsyncConnection, groups: list[str]) -> None:
        new = [g for g in groups if g not in self._known_groups]
        if not new:
            return
        G = self._t.groups
        stmt = select(G.c.group_key).where(G.c.group_key.in_(new))
        have = {r[0] for r in await conn.execute(stmt)}
        missing = [{"group_key": g} for g in new if g not in have]
        if missing:
            await self._ops.insert_ignore(conn, G, missing)
        # Cache only rows seen committed: this transaction may still roll back.
        self._known_groups.update(have)

    # -- enqueue --------------------------------------------------------------------------
    def batch(self, connection: AsyncConnection | AsyncSession | None = None) -> Batch:
        """Collect jobs and containers to insert as one DAG in one transaction."""
        return Batch(self, connection)

    async def enqueue(
        self,
        type: str,
        args: dict[str, Any] | None = None,
        *,
        group: str | None = None,
        weight: int = 1,
        depends_on: Iterable[JobRef | int] = (),
        run_after: timedelta | datetime | float | None = None,
        priority: int = 0,
        timeout: float | None = None,
        max_attempts: int | None = None,
        key: str | None = None,
        parent: JobRef | int | None = None,
    ) -> int:
        """Enqueue one job; returns its id (or, with a live ``key``, the existing job's id)."""
        b = self.batch()
        ref = b.add(type, args, group=group, weight=weight, depends_on=depends_on,
                    run_after=run_after, priority=priority, timeout=timeout,
                    max_attempts=max_attempts, key=key, parent=parent)
        await b.commit()
        return ref.id

    async def _insert_batch(
        self, specs: list[_Spec], connection: AsyncConnection | AsyncSession | None
    ) -> list[int]:
        if connection is not None:
            if isinstance(connection, AsyncSession):
                conn = await connection.connection()
            else:
                conn = connection
            ids, any_ready = await insert_specs(self, conn, specs)
            return ids
        if self._ops.autocommit_insert and self._lone_insert(specs):
            # One INSERT statement does it all (times from the database clock, the wake-up
            # in the same statement): it is atomic by itself, so skip BEGIN and COMMIT.
            done = await insert_alone(self, specs)
            if done is not None:
                ids, any_ready = done
                if any_ready and self._worker is not None:
                    self._worker.wake.set()
                return ids
        for attempt in range(3):
            try:
                ids, any_ready = await self._write(lambda conn: insert_specs(self, conn, specs))
                if any_ready and self._worker is not None:
                    self._worker.wake.set()  # a worker in this process starts it at once
                return ids
            except IntegrityError:  # a concurrent insert took the same key: look again
                if attempt == 2:
                    raise
                for s in specs:
                    s.ref._id = None
        raise AssertionError("unreachable")

    def _lone_insert(self, specs: list[_Spec]) -> bool:
        """Jobs whose insert is a single statement: no key, edge, parent or container, a
        group already known to exist, no absolute run_after, and few enough for one bulk
        statement (a bulk load's chunk of 1,000 is one round trip, not BEGIN, INSERT, COMMIT)."""
        return len(specs) <= BULK_ROWS and all(
            s.key is None and not s.depends_on and s.parent is None and not s.is_container
            and s.group in self._known_groups and not isinstance(s.run_after, datetime)
            for s in specs
        )

    # -- inspection -----------------------------------------------------------------------
    async def get(self, job_id: int) -> Job:
        """A snapshot of one job. Raises JobNotFoundError."""
        _check_id(job_id)
        J, D = self._t.jobs, self._t.deps

        async def read(conn: AsyncConnection) -> Job:
            row = (await conn.execute(select(J).where(J.c.id == job_id))).first()
            if row is None:
                raise JobNotFoundError(f"no job with id {job_id}")
            deps = [r[0] for r in await conn.execute(
                select(D.c.depends_on_id).where(D.c.job_id == job_id).order_by(D.c.depends_on_id))]
            return _to_job(row, deps)

        return await self._read(read)

    async def explain(self, job_id: int) -> Explanation:
        """Why the job is not running now: ``Explanation.reasons`` (see aiojobqueue.explain
        for the codes); ``str()`` of it reads as a short paragraph. Raises JobNotFoundError."""
        _check_id(job_id)
        return await explain(self, job_id)

    async def wait(self, job_id: int, timeout: float | None = None) -> Any:
        """Wait until the job is terminal; return its result or raise JobFailed/JobCancelled.

        Raises the builtin TimeoutError if ``timeout`` passes first."""
        async with asyncio.timeout(timeout):
            delay = 0.01
            while True:
                job = await self.get(job_id)
                if job.state == JobState.DONE:
                    return job.result
                if job.state == JobState.FAILED:
                    raise JobFailed(job_id, job.error)
                if job.state == JobState.CANCELLED:
                    raise JobCancelled(job_id, job.error)
                done = self._local_done
                # asyncio.timeout, not wait_for (3.11's wait_for can swallow a cancellation)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await done.wait()
                delay = min(delay * 1.5, self.poll_interval)

    async def cancel(self, job_id: int) -> None:
        """Cancel a job or container and everything waiting on it. A running job is stopped
        by its worker within about one heartbeat interval."""
        _check_id(job_id)
        await self._write(lambda conn: self._completer.cancel(conn, job_id))

    async def retry(self, job_id: int) -> None:
        """Make a failed or cancelled job runnable again, with the jobs its end cancelled."""
        _check_id(job_id)
        await self._write(lambda conn: self._completer.retry(conn, job_id))
        if self._worker is not None:
            self._worker.wake.set()

    # -- serving --------------------------------------------------------------------------
    async def serve(self) -> None:
        """Run jobs until cancelled; on cancellation shut down gracefully."""
        await self.start()
        self._worker = Worker(self)
        try:
            await self._worker.serve()
        finally:
            self._worker = None

    async def run_until_idle(self) -> None:
        """Run jobs until nothing this process can run is runnable and nothing is in flight
        anywhere (retries in backoff count as in flight; jobs delayed by run_after do not)."""
        await self.start()
        self._worker = Worker(self)
        try:
            await self._worker.serve(until_idle=True)
        finally:
            self._worker = None


def _check_id(job_id: Any) -> None:
    """Ids are positive 64-bit ints: anything else names no job (and must not reach the
    driver, which would fail with an untyped error)."""
    if not isinstance(job_id, int) or isinstance(job_id, bool) or not 0 < job_id <= MAX_ID:
        raise JobNotFoundError(f"no job with id {job_id!r}")


def _to_job(row: Any, deps: list[int]) -> Job:
    errors, omitted = history.snapshot(row.errors)
    return Job(
        id=row.id, type=row.type, args=row.args, state=JobState(row.state), result=row.result,
        error=row.error, attempts=row.attempts, max_attempts=row.max_attempts,
        group=row.group_key, weight=row.weight, priority=row.priority, parent_id=row.parent_id,
        is_container=row.kind == S.CONTAINER, key=row.key, depends_on=tuple(deps),
        cancelled_by=row.cancelled_by, lease_owner=row.lease_owner, created_at=row.created_at,
        run_after=row.run_after, started_at=row.started_at, finished_at=row.finished_at,
        progress=progress.snapshot(row.progress), errors=errors, errors_omitted=omitted,
    )

"""SyncQueue: the queue for synchronous code (Django and Flask views, management commands,
cron scripts).

It shares everything with ``JobQueue`` rather than being a second implementation:

* A SyncQueue owns a ``JobQueue`` started on a private event loop in a thread of its own.
  ``get``, ``wait``, ``cancel``, ``retry``, ``explain`` and the policy's methods
  (``policy``, ``set_policy``, ``set_group``, ``pause``, ``resume``) run the JobQueue's
  coroutines there and hand back their result or exception. The caller's thread needs no event loop,
  and may be one whose own loop is running (``asyncio.run`` could not).
* The insert (an enqueue, a batch) runs in the caller's thread: the JobQueue's own insert
  (insert.py, after the same ``Batch`` checks) on a sync connection, through
  ``syncbridge.SyncConnection``: the insert's ``await conn.execute(...)`` calls are
  answered by the sync connection at once, so the coroutine never suspends and is driven
  to its end without an event loop (``syncbridge.drive``). The connection is the caller's
  (``connection=``: the jobs exist iff the caller's transaction commits) or one of the
  SyncQueue's own sync engine (the flow of ``Inserter.insert``); syncinsert.py holds
  those engines and both flows. No
  hand-over to the loop's thread and back: measured, that cost 25-45% of the enqueue rate
  (bench/sync_enqueue.py has the figures of the design kept). A batch is a ``SyncBatch``
  (syncbatch.py).
* A forked child (gunicorn, multiprocessing) starts afresh on its first call: the loop's
  thread does not survive a fork, and the pooled connections stay the parent's.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine, Iterable
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import Session

from . import schema as S
from .batch import Batch, JobRef
from .dialects.urls import async_url, async_url_of
from .errors import (
    ConfigurationError,
    InvalidJobError,
    NotStartedError,
)
from .explain import Explanation
from .handlers import Handler
from .insert import Inserter
from .limits import RateLimit
from .models import Job
from .queue import JobQueue
from .schedules import ScheduleInfo
from .settings import DEFAULT_POOL_SIZE
from .stored_policy import UNSET, Policy, Unset
from .syncbatch import SyncBatch as SyncBatch  # aiojobqueue imports it from here
from .syncinsert import SyncInserts

T = TypeVar("T")


class SyncQueue:
    """A job queue client for code that is not async: enqueue, inspect, cancel, retry.

    ``url_or_engine``: the same URLs as ``JobQueue`` (``sqlite:///jobs.db``,
    ``postgresql://…``, ``mysql://…``, with an async or a sync driver named or none), or a
    SQLAlchemy ``Engine``/``AsyncEngine`` whose URL it connects to (with a pool of its own,
    ``pool_size`` connections). The schema is created or upgraded on the first call, as
    ``JobQueue.start`` does.

    Thread-safe: one SyncQueue serves every thread of a process. It runs no jobs (a worker,
    ``JobQueue.serve`` or ``aiojobqueue worker``, does). ``close()`` it when done, or use
    it as a context manager.
    """

    def __init__(
        self,
        url_or_engine: str | URL | Engine | AsyncEngine,
        *,
        prefix: str = S.DEFAULT_PREFIX,
        max_attempts: int = 3,
        default_group: str = "default",
        pool_size: int = DEFAULT_POOL_SIZE,
    ) -> None:
        url = _url_of(url_or_engine)

        def make_queue() -> JobQueue:
            return JobQueue(async_url_of(url), prefix=prefix, max_attempts=max_attempts,
                            default_group=default_group, pool_size=pool_size)

        self._make_queue = make_queue
        self._queue = make_queue()
        #: the inserts, in the caller's thread, on sync engines of their own
        self._inserts = SyncInserts(url, pool_size, self._inserter)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._pid = os.getpid()

    @property
    def prefix(self) -> str:
        """The table prefix."""
        return self._queue.prefix

    @property
    def engine(self) -> Engine:
        """The sync engine this SyncQueue inserts with (the URL's sync driver: psycopg,
        PyMySQL, sqlite3). An app may share it for its own tables, so that one URL serves
        both; enqueue with ``connection=`` on it to join the app's transactions."""
        return self._inserts.engine

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Connect and create or upgrade the schema (the first call does it anyway)."""
        self._run(self._queue.start())

    def close(self) -> None:
        """Close the connections and stop the private event loop. Idempotent."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._closed = True
            self._loop = self._thread = None
        self._inserts.close()
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._queue.close(), loop).result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    def __enter__(self) -> SyncQueue:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _loop_for_call(self) -> asyncio.AbstractEventLoop:
        """The private event loop, started (with the queue) on first use."""
        loop = self._loop
        if self._pid != os.getpid():
            self._forked()
        elif loop is not None:
            return loop
        with self._lock:
            if self._closed:
                raise NotStartedError("this SyncQueue is closed")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, daemon=True,
                                          name=f"aiojobqueue-sync-{self.prefix}")
                thread.start()
                try:
                    asyncio.run_coroutine_threadsafe(self._queue.start(), loop).result()
                except BaseException:
                    loop.call_soon_threadsafe(loop.stop)
                    thread.join()
                    loop.close()
                    raise
                self._loop, self._thread = loop, thread
            return self._loop

    def _forked(self) -> None:
        """In a child process (os.fork: gunicorn, multiprocessing) the loop's thread did not
        come along and the pooled connections are the parent's: leave them to it (closing
        them would end the parent's sessions) and start afresh on first use."""
        self._lock = threading.Lock()  # (the parent's may have been held at the fork)
        self._pid = os.getpid()
        self._inserts.forked()
        self._queue = self._make_queue()
        self._loop = self._thread = None

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the private loop; its result, or its exception raised here."""
        try:
            loop = self._loop_for_call()
        except BaseException:
            coro.close()
            raise
        if threading.current_thread() is self._thread:  # a hook calling back: would hang
            coro.close()
            raise RuntimeError("SyncQueue cannot be called from its own event loop thread")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    # -- enqueue --------------------------------------------------------------------------
    def batch(self, connection: Connection | Session | None = None) -> SyncBatch:
        """Collect jobs and containers to insert as one DAG in one transaction (``with
        queue.batch() as b:``; inserted when the block exits without an exception).

        ``connection``: a SQLAlchemy sync ``Connection`` or ``Session`` whose transaction the
        insert joins: the jobs exist if and only if the caller commits it."""
        if connection is not None and not isinstance(connection, (Connection, Session)):
            raise InvalidJobError(
                "connection must be a SQLAlchemy Connection or Session, got "
                f"{connection.__class__.__name__} (JobQueue.batch takes async ones)")
        conn = connection

        async def insert(specs: list[Any], _: Any) -> list[int]:
            # never suspends (see syncbridge.drive)
            return self._inserts.own(specs) if conn is None else self._inserts.on(specs, conn)

        return SyncBatch(Batch(self._queue.settings, self._queue._handlers, insert, None))

    def enqueue(
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
        connection: Connection | Session | None = None,
        when: str = "done",
        debounce: timedelta | float | None = None,
        debounce_max: timedelta | float | None = None,
        tags: Iterable[str] | None = None,
    ) -> int:
        """Enqueue one job and return its id (with a live ``key``: the existing job's id),
        as ``JobQueue.enqueue`` does; ``connection``: see ``batch``. ``debounce`` (with
        ``key``) goes through the queue's own transaction: not with ``connection``."""
        if debounce is not None:
            if connection is not None:
                raise ConfigurationError("debounce= takes the queue's own transaction: "
                                         "it cannot join connection=")
            return self._run(self._queue.enqueue(
                type, args, group=group, weight=weight, depends_on=depends_on,
                run_after=run_after, priority=priority, timeout=timeout,
                max_attempts=max_attempts, key=key, parent=parent, when=when,
                debounce=debounce, debounce_max=debounce_max, tags=tags))
        b = self.batch(connection)
        ref = b.add(type, args, group=group, weight=weight, depends_on=depends_on,
                    run_after=run_after, priority=priority, timeout=timeout,
                    max_attempts=max_attempts, key=key, parent=parent, when=when, tags=tags)
        b.commit()
        return ref.id

    def _inserter(self) -> Inserter:
        """The private JobQueue's Inserter (started on first use: the schema exists)."""
        self._loop_for_call()
        inserter = self._queue._inserter
        if inserter is None:
            raise NotStartedError("this SyncQueue is closed")
        return inserter

    # -- inspection and actions -----------------------------------------------------------
    def get(self, job_id: int) -> Job:
        """A snapshot of one job. Raises JobNotFoundError."""
        return self._run(self._queue.get(job_id))

    def wait(self, job_id: int, timeout: float | None = None) -> Any:
        """Block until the job is terminal; return its result or raise JobFailed /
        JobCancelled (the builtin TimeoutError once ``timeout`` seconds have passed)."""
        return self._run(self._queue.wait(job_id, timeout))

    def explain(self, job_id: int) -> Explanation:
        """Why the job is not running now (see ``JobQueue.explain``)."""
        return self._run(self._queue.explain(job_id))

    def cancel(self, job_id: int) -> None:
        """Cancel a job or container and everything waiting on it (see
        ``JobQueue.cancel``)."""
        self._run(self._queue.cancel(job_id))

    def retry(self, job_id: int) -> None:
        """Make a failed or cancelled job runnable again (see ``JobQueue.retry``)."""
        self._run(self._queue.retry(job_id))

    def enqueue_external(self, type: str = "external", args: dict[str, Any] | None = None,
                         **options: Any) -> int:
        """Enqueue one external step (see ``JobQueue.enqueue_external``)."""
        return self._run(self._queue.enqueue_external(type, args, **options))

    def complete(self, job_id: int, result: Any = None) -> None:
        """End an external step as done (see ``JobQueue.complete``): a webhook view's call."""
        self._run(self._queue.complete(job_id, result))

    def fail(self, job_id: int, error: str | dict[str, Any] | None = None) -> None:
        """End an external step as failed (see ``JobQueue.fail``)."""
        self._run(self._queue.fail(job_id, error))

    # -- the policy in the database (see JobQueue.policy) ---------------------------------
    def policy(self) -> Policy:
        """The policy in force, as stored: caps, weights, rates and pauses."""
        return self._run(self._queue.policy())

    def set_policy(self, *, concurrency: int | Unset | None = UNSET,
                   rate: RateLimit | Unset | None = UNSET) -> None:
        """Set the fleet-wide cap and/or the queue's rate; None clears one, an argument
        not given is left as it is (see ``JobQueue.set_policy``)."""
        self._run(self._queue.set_policy(concurrency=concurrency, rate=rate))

    def set_group(self, name: str, *, weight: int | Unset | None = UNSET,
                  cap: int | Unset | None = UNSET,
                  rate: RateLimit | Unset | None = UNSET) -> None:
        """Set group ``name``'s weight, cap and/or rate (None clears one; ``"*"``: every
        group without a row of its own; see ``JobQueue.set_group``)."""
        self._run(self._queue.set_group(name, weight=weight, cap=cap, rate=rate))

    def pause(self, *, group: str | None = None, type: str | None = None) -> None:
        """Start no job of ``group``, of ``type``, or (neither) of the whole queue until
        ``resume``; running jobs finish (see ``JobQueue.pause``)."""
        self._run(self._queue.pause(group=group, type=type))

    def resume(self, *, group: str | None = None, type: str | None = None) -> None:
        """Undo ``pause`` with the same arguments."""
        self._run(self._queue.resume(group=group, type=type))
    # -- schedules (see the JobQueue methods of the same names) -----------------------------
    def schedules(self) -> list[ScheduleInfo]:
        """Every schedule in the database: spec, paused, last slot enqueued, next slot."""
        return self._run(self._queue.schedules())

    def pause_schedule(self, name: str) -> bool:
        """Stop every worker enqueuing the schedule's slots; False if already paused."""
        return self._run(self._queue.pause_schedule(name))

    def resume_schedule(self, name: str) -> bool:
        """Enqueue the schedule's slots again, from the next one; False if not paused."""
        return self._run(self._queue.resume_schedule(name))

    def trigger_schedule(self, name: str) -> int:
        """Enqueue one job of the schedule now; its id."""
        return self._run(self._queue.trigger_schedule(name))


def _url_of(url_or_engine: str | URL | Engine | AsyncEngine) -> str:
    """The URL text of a URL or an engine (with its password)."""
    if isinstance(url_or_engine, AsyncEngine):
        url_or_engine = url_or_engine.sync_engine
    if isinstance(url_or_engine, Engine):
        url_or_engine = url_or_engine.url
    if isinstance(url_or_engine, URL):
        return url_or_engine.render_as_string(hide_password=False)
    if not isinstance(url_or_engine, str):
        raise ConfigurationError(
            f"SyncQueue takes a database URL or a SQLAlchemy engine, got {url_or_engine!r}")
    async_url(url_or_engine)  # a clear error for what is not a database URL
    return url_or_engine

"""Plain ``def`` handlers: they run in worker threads, at most ``capacity`` at once.

The event loop hands the call to a thread (``call_plain``) and waits for it; the handler's
``ctx`` is a ``ThreadContext``, whose methods hand their coroutine back to the loop
(``asyncio.run_coroutine_threadsafe``) and block the thread until it is done. The loop
thread keeps running meanwhile: a handler that spins in pure Python holds the GIL only for
a switch interval (5 ms) at a time, so heartbeats and the lease guard still run.

A thread cannot be stopped. When its attempt ends first (timeout, cancel, lease lost,
shutdown), the attempt's outcome is written as usual, and the thread is counted as
*lingering* until it returns: the worker's free slots are ``capacity`` minus its running
attempts minus its lingering threads, so caps stay true. The threads are daemon threads
of a pool of this module's own (``concurrent.futures.ThreadPoolExecutor`` joins its
threads at interpreter exit: one stuck handler would keep a stopped worker alive).
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
import weakref
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .batch import Batch, JobRef
    from .core import Core
    from .executor import JobContext
    from .handlers import Handler
    from .queue import JobQueue

T = TypeVar("T")

__all__ = ["LoopBatch", "ThreadContext", "call_plain", "close", "lingering"]

_Item = tuple[Future[Any], Callable[[], Any]]


class _Pool:
    """At most ``size`` daemon threads, started as calls need them."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._q: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0  # threads waiting for work and not yet promised an item
        self.lingering = 0  # threads whose attempt ended before they returned (loop only)

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        f: Future[Any] = Future()
        with self._lock:
            if self._idle:
                self._idle -= 1  # that thread takes this item (any item: they are alike)
            elif self._threads < self._size:
                self._threads += 1
                threading.Thread(target=self._work, daemon=True,
                                 name=f"aiojobqueue-plain-{self._threads}").start()
        self._q.put((f, fn))
        return f

    def _work(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            f, fn = item
            if f.set_running_or_notify_cancel():
                try:
                    result = fn()
                except BaseException as exc:  # handed to the waiting attempt
                    f.set_exception(exc)
                else:
                    f.set_result(result)
            del item, f, fn  # (no reference to the last call's result while idle)
            with self._lock:
                self._idle += 1

    def close(self) -> None:
        """Idle threads exit; busy ones when their call returns."""
        with self._lock:
            n, self._threads, self._idle = self._threads, 0, 0
        for _ in range(n):
            self._q.put(None)


_pools: weakref.WeakKeyDictionary[Core, _Pool] = weakref.WeakKeyDictionary()


def lingering(core: Core) -> int:
    """Threads of ``core`` still running whose attempt has ended (they hold a slot)."""
    pool = _pools.get(core)
    return pool.lingering if pool is not None else 0


def close(core: Core) -> None:
    """Let ``core``'s threads exit (JobQueue.close)."""
    pool = _pools.pop(core, None)
    if pool is not None:
        pool.close()


async def call_plain(core: Core, fn: Callable[..., Any], ctx: JobContext,
                     args: dict[str, Any]) -> Any:
    """``fn(ThreadContext(ctx), **args)`` in a worker thread; its result or exception. If
    this await ends first (timeout, cancellation) the thread is counted as lingering until
    it returns, then the worker is woken to fill the slot."""
    pool = _pools.get(core)
    if pool is None:
        pool = _pools[core] = _Pool(core.settings.capacity)
    loop = asyncio.get_running_loop()
    tctx = ThreadContext(ctx, loop)
    run = contextvars.copy_context().run  # (tracing and logging context, as a task has)
    cf = pool.submit(lambda: run(fn, tctx, **args))
    try:
        return await asyncio.wrap_future(cf)
    except BaseException:
        if not cf.done():  # the thread runs on: its slot stays taken until it returns
            pool.lingering += 1
            cf.add_done_callback(lambda _: loop.call_soon_threadsafe(_freed, core, pool))
        raise


def _freed(core: Core, pool: _Pool) -> None:
    pool.lingering -= 1
    core.signals.wake()  # the worker fills the slot


class ThreadContext:
    """The ``ctx`` of a plain ``def`` handler: ``JobContext``'s API, synchronous. Each call
    runs on the worker's event loop and blocks this thread until it is done."""

    def __init__(self, ctx: JobContext, loop: asyncio.AbstractEventLoop) -> None:
        self._ctx = ctx
        self._loop = loop

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def job_id(self) -> int:
        return self._ctx.job_id

    @property
    def attempt(self) -> int:
        """1 for the first run; counts every claim, retries included."""
        return self._ctx.attempt

    @property
    def group(self) -> str:
        return self._ctx.group

    @property
    def type(self) -> str:
        return self._ctx.type

    @property
    def parent_id(self) -> int | None:
        return self._ctx.parent_id

    @property
    def queue(self) -> JobQueue:
        """The JobQueue (its coroutines belong to the worker's loop, not this thread)."""
        return self._ctx.queue

    @property
    def checkpointed(self) -> Any:
        """The state saved by the last ``checkpoint()`` of an earlier attempt, else None."""
        return self._ctx.checkpointed

    def checkpoint(self, state: Any) -> None:
        """See ``JobContext.checkpoint`` (raises LeaseLostError once the attempt ended)."""
        self._run(self._ctx.checkpoint(state))

    def progress(self, done: float, total: float | None = None,
                 message: str | None = None) -> None:
        """See ``JobContext.progress``."""
        self._run(self._ctx.progress(done, total, message))

    def dependency_results(self) -> dict[int, Any]:
        """``{dependency id: result}`` of the jobs this one depends on."""
        return self._run(self._ctx.dependency_results())

    def enqueue(self, type: str | Handler[..., Any], args: dict[str, Any] | None = None,
                **options: Any) -> int:
        """Enqueue one more job (see ``JobQueue.enqueue``)."""
        return self._run(self._ctx.enqueue(type, args, **options))

    def batch(self) -> LoopBatch:
        """A batch to add jobs from this thread (a dynamic DAG): ``with ctx.batch() as b:``
        inserts on leaving the block."""
        return LoopBatch(self._ctx.batch(), self._run)


class LoopBatch:
    """``Batch`` for a plain handler's thread: the same ``add`` and ``container`` (the same
    checks and options), inserted by ``commit()`` on the worker's loop, or on leaving
    ``with`` without an exception."""

    def __init__(self, batch: Batch,
                 run: Callable[[Coroutine[Any, Any, list[int]]], list[int]]) -> None:
        self._batch = batch
        self._run = run

    def add(self, type: str | Handler[..., Any], args: dict[str, Any] | None = None,
            **options: Any) -> JobRef:
        """Add a job (see ``Batch.add``)."""
        return self._batch.add(type, args, **options)

    def container(self, type: str, **options: Any) -> JobRef:
        """Add a container (see ``Batch.container``)."""
        return self._batch.container(type, **options)

    def commit(self) -> list[int]:
        """Insert everything added so far; the ids in order."""
        return self._run(self._batch.commit())

    def __enter__(self) -> LoopBatch:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if et is None:
            self.commit()

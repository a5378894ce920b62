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
threads at interpreter exit: one stuck handler would keep a stopped worker alive), which
hands ended calls back to the loop in batches: one ``call_soon_threadsafe`` for all the
calls that end before the loop takes them (measured: a no-op plain job then costs the
process about the CPU of an async one at capacity 50, where one hand-over per call cost
70% more; bench/django_plain.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import threading
import weakref
from collections.abc import Callable, Coroutine
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

_QUEUED, _RUNNING, _DONE, _DROPPED = range(4)


class _Call:
    """One handler call handed to a thread; ``state`` changes under the pool's lock."""

    __slots__ = ("failed", "fn", "fut", "lingering", "outcome", "state")

    def __init__(self, fn: Callable[[], Any], fut: asyncio.Future[Any]) -> None:
        self.fn: Callable[[], Any] | None = fn
        self.fut = fut
        self.state = _QUEUED
        self.outcome: Any = None
        self.failed = False
        self.lingering = False  # its attempt ended while it ran (counted in the pool's)


class _Pool:
    """At most ``size`` daemon threads, started as calls need them. Calls that end are
    handed back to the loop in batches: one ``call_soon_threadsafe`` (one wake-up of the
    loop) for every call that ends while the loop has not yet taken the previous ones."""

    def __init__(self, size: int, loop: asyncio.AbstractEventLoop,
                 on_freed: Callable[[], None]) -> None:
        self._size = size
        self._loop = loop
        self._on_freed = on_freed
        self._q: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0  # threads waiting for work and not yet promised an item
        self._ended: list[_Call] = []
        self._handing = False  # a hand-over to the loop is scheduled
        self.lingering = 0  # threads whose attempt ended before they returned (loop only)

    def submit(self, fn: Callable[[], Any]) -> _Call:
        call = _Call(fn, self._loop.create_future())
        with self._lock:
            if self._idle:
                self._idle -= 1  # that thread takes this item (any item: they are alike)
            elif self._threads < self._size:
                self._threads += 1
                threading.Thread(target=self._work, daemon=True,
                                 name=f"aiojobqueue-plain-{self._threads}").start()
        self._q.put(call)
        return call

    def _work(self) -> None:
        while True:
            call = self._q.get()
            if call is None:
                return
            with self._lock:
                run = call.state == _QUEUED
                if run:
                    call.state = _RUNNING
            fn, call.fn = call.fn, None
            if run and fn is not None:
                try:
                    call.outcome = fn()
                except BaseException as exc:  # handed to the waiting attempt
                    call.outcome, call.failed = exc, True
                with self._lock:
                    call.state = _DONE
                    self._ended.append(call)
                    hand, self._handing = not self._handing, True
                if hand:
                    with contextlib.suppress(RuntimeError):  # (the loop is closed)
                        self._loop.call_soon_threadsafe(self._hand_over)
            del call, fn  # (no reference to the last call's result while idle)
            with self._lock:
                self._idle += 1

    def _hand_over(self) -> None:
        """On the loop: the ended calls' outcomes to their awaiting attempts."""
        with self._lock:
            ended, self._ended, self._handing = self._ended, [], False
        freed = False
        for call in ended:
            if call.lingering:
                self.lingering -= 1
                freed = True
            elif not call.fut.done():
                if call.failed:
                    call.fut.set_exception(call.outcome)
                else:
                    call.fut.set_result(call.outcome)
            call.outcome = None
        if freed:
            self._on_freed()  # the worker fills the slot

    def abandon(self, call: _Call) -> None:
        """On the loop, when the attempt ended first: a call not started never runs; one
        running keeps its slot (``lingering``) until it returns."""
        with self._lock:
            if call.state == _QUEUED:
                call.state = _DROPPED
            elif call.state == _RUNNING:
                call.lingering = True
                self.lingering += 1

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
    loop = asyncio.get_running_loop()
    pool = _pools.get(core)
    if pool is None:
        pool = _pools[core] = _Pool(core.settings.capacity, loop, core.signals.wake)
    tctx = ThreadContext(ctx, loop)
    run = contextvars.copy_context().run  # (tracing and logging context, as a task has)
    call = pool.submit(lambda: run(fn, tctx, **args))
    try:
        return await call.fut
    except BaseException:
        if call.fut.cancelled() or not call.fut.done():  # not the handler's own exception
            pool.abandon(call)
        raise


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

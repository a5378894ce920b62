"""aiojobqueue adapter for both shared benchmark harnesses.

* ``/work/shared/bench-peers`` (PostgreSQL): ``async install(dsn)``, ``async
  enqueue_batch(dsn, n, chunk)``, ``Producer``, ``async work(dsn, C, drain, rec, stop)``,
  ``async verify(dsn, n)``.
* ``/work/shared/bench-sqlite-mariadb``: the same names, called synchronously with a
  *target* dict (``{"db": "sqlite"|"postgres"|"mariadb", ...}``) instead of a DSN, plus
  ``produce`` and ``CONCURRENCY``.

Each entry point looks at its first argument: a ``str`` is a DSN (PostgreSQL harness,
returns a coroutine), a ``dict`` is a target (SQLite/MariaDB harness, runs to completion).

Settings (what a user gets by default, with the crash-safety machinery on): ``capacity=C``
(jobs in flight in this worker process), no global ``concurrency`` cap, the default
``poll_interval=1.0``, ``lease_ttl=30``, ``heartbeat_interval=10``: every completion is a
fenced finalize (row lock, attempt + lease-owner check) written by the batching flusher,
every claim sets a lease. The drain mode is ``run_until_idle()``; listen mode is
``serve()`` (LISTEN/NOTIFY on PostgreSQL, polling elsewhere) until ``stop``.
Verification: N rows ``done``, N distinct ids, each with ``attempts = 1``, nothing live.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

NAME = "aiojobqueue"
CONCURRENCY = (1, 10, 50)
TYPE = "noop"
PREFIX = "ajq_"
# Extra JobQueue keywords for side runs, e.g. AJQ_OPTS='{"poll_interval": 0.1}'
_OPTS: dict[str, Any] = {}
if os.environ.get("AJQ_OPTS"):
    import json as _json

    _OPTS = _json.loads(os.environ["AJQ_OPTS"])


def _url(where: str | dict[str, Any]) -> str:
    if isinstance(where, str):
        base = where.split("://", 1)[1]
        return "postgresql+asyncpg://" + base
    db = where["db"]
    if db == "sqlite":
        return "sqlite+aiosqlite:///" + where["path"]
    if db == "postgres":
        return "postgresql+asyncpg://" + where["dsn"].split("://", 1)[1]
    if db == "mariadb":
        return f"mysql+aiomysql://root@127.0.0.1:3306/{where['name']}"
    raise ValueError(db)


def _queue(where: str | dict[str, Any], capacity: int = 10, **kw: Any) -> Any:
    from aiojobqueue import JobQueue

    return JobQueue(_url(where), capacity=capacity, prefix=PREFIX, **(_OPTS | kw))


def _sync_or_async(where: Any, coro: Any) -> Any:
    """A DSN string means the async PostgreSQL harness; a target dict the sync one."""
    if isinstance(where, dict):
        return asyncio.run(coro)
    return coro


# -- install --------------------------------------------------------------------------------
async def _install(where: Any) -> None:
    async with _queue(where):
        pass


def install(where: Any, conc: int | None = None) -> Any:
    return _sync_or_async(where, _install(where))


# -- enqueue --------------------------------------------------------------------------------
async def _enqueue_batch(where: Any, n: int, chunk: int) -> float:
    async with _queue(where) as q:
        t0 = time.perf_counter()
        for i in range(0, n, chunk):
            async with q.batch() as b:
                for _ in range(min(chunk, n - i)):
                    b.add(TYPE, {"ts": 0.0})
        return time.perf_counter() - t0


def enqueue_batch(where: Any, n: int, chunk: int) -> Any:
    return _sync_or_async(where, _enqueue_batch(where, n, chunk))


class Producer:
    """PostgreSQL harness: single enqueue() calls from one process."""

    async def open(self, dsn: str) -> None:
        self.q = _queue(dsn)
        await self.q.start()

    async def enqueue_one(self, warmup: bool = False) -> None:
        ts = -1.0 if warmup else time.time()
        await self.q.enqueue(TYPE, {"ts": ts})

    async def close(self) -> None:
        await self.q.close()


async def _produce(target: dict[str, Any], warm: int, m: int, gap: float) -> None:
    p = Producer()
    p.q = _queue(target)
    await p.q.start()
    try:
        for _ in range(warm):
            await p.enqueue_one(warmup=True)
            await asyncio.sleep(0.2)
        for _ in range(m):
            await p.enqueue_one()
            await asyncio.sleep(gap)
    finally:
        await p.close()


def produce(target: dict[str, Any], warm: int, m: int, gap: float) -> None:
    asyncio.run(_produce(target, warm, m, gap))


# -- work -----------------------------------------------------------------------------------
async def _work(where: Any, conc: int, drain: bool, rec: Any, stop: Any) -> None:
    q = _queue(where, capacity=conc)

    @q.handler(TYPE)
    async def noop(ctx: Any, ts: float = 0.0) -> None:
        rec.start(ctx.job_id, ts)
        rec.end()

    async with q:
        if drain:
            await q.run_until_idle()
            return
        task = asyncio.create_task(q.serve())
        if isinstance(stop, asyncio.Event):
            await stop.wait()
        else:  # threading.Event from the SQLite/MariaDB harness
            while not stop.is_set():  # noqa: ASYNC110 - a threading.Event
                await asyncio.sleep(0.01)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def work(where: Any, conc: int, drain: bool, rec: Any, stop_or_wid: Any) -> Any:
    if isinstance(where, dict):
        return asyncio.run(_work(where, conc, drain, rec, rec.stop))
    return _work(where, conc, drain, rec, stop_or_wid)


# -- verify ---------------------------------------------------------------------------------
async def _verify(where: Any, n: int) -> dict[str, Any]:
    from sqlalchemy import case, func, select

    from aiojobqueue import schema as S

    q = _queue(where)
    J = q._t.jobs
    async with q, q.engine.connect() as conn:
        done = case((J.c.state == S.DONE, 1), else_=0)
        row = (await conn.execute(select(
            func.coalesce(func.sum(done), 0),
            func.count(func.distinct(case((J.c.state == S.DONE, J.c.id)))),
            func.coalesce(func.sum(case((J.c.state.in_(S.LIVE), 1), else_=0)), 0),
            func.coalesce(func.sum(J.c.attempts), 0),
            func.max(J.c.finished_at),
        ))).one()
    completed, distinct_done, remaining, starts, t_last = row
    return {
        "completed": int(completed), "distinct": int(distinct_done), "remaining": int(remaining),
        "starts": int(starts),
        "t_last_done": t_last.timestamp() if t_last is not None else None,
        "sql_verified": True,
    }


def verify(where: Any, n: int) -> Any:
    return _sync_or_async(where, _verify(where, n))

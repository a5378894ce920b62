"""SQLite with several worker processes on one file: "database is locked" never surfaces as
a crash and no job is ever claimed twice."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from crashkit import Fleet, fleet_factory  # noqa: F401 - fixture
from sqlalchemy import event, func, select
from sqlalchemy.engine import make_url

from aiojobqueue import JobContext, JobQueue, JobState


@pytest.mark.slow
@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
async def test_four_processes_on_one_sqlite_file(
    make_queue: Callable[..., JobQueue], fleet_factory: Callable[..., Fleet]  # noqa: F811
) -> None:
    async with make_queue() as q:
        fleet = fleet_factory(ttl=5.0, hb=0.5, capacity=4)
        procs = [fleet.spawn() for _ in range(4)]
        for p in procs:
            await fleet.ready(p)
        n = 1000
        async with q.batch() as b:
            refs = [b.add("sleep", {"seconds": 0.0}) for _ in range(n)]
        t0 = time.monotonic()
        last = refs[-1].id
        await q.wait(last, timeout=120)
        J = q._t.jobs

        async def states(conn: object) -> dict[str, int]:
            rows = await conn.execute(  # type: ignore[attr-defined]
                select(J.c.state, func.count()).group_by(J.c.state))
            return {r[0]: r[1] for r in rows}

        deadline = time.monotonic() + 120
        while (await q._read(states)).get(JobState.DONE, 0) < n:
            assert time.monotonic() < deadline, fleet.dump()
            await asyncio.sleep(0.1)
        took = time.monotonic() - t0
        starts = Counter(e["job"] for e in fleet.events("start"))
        fins = Counter(e["job"] for e in fleet.events("fin"))
        assert len(starts) == n and set(starts.values()) == {1}, "a job ran twice"
        assert len(fins) == n and set(fins.values()) == {1}
        per_proc = Counter(e["pid"] for e in fleet.events("fin"))
        assert len(per_proc) >= 2, per_proc  # they really shared the work
        assert all(p.poll() is None for p in procs), fleet.dump()
        logs = fleet.worker_logs()
        assert "Traceback" not in logs and "ERROR" not in logs, logs[-3000:]
        for j in [await q.get(r.id) for r in refs[::50]]:
            assert j.attempts == 1 and j.result["job"] == j.id
        for p in procs:
            fleet.term(p)
        assert [p.wait(timeout=30) for p in procs] == [0, 0, 0, 0]
        print(f"{n} jobs over 4 processes in {took:.1f}s; per process {dict(per_proc)}; "
              f"'locked' retries logged: {logs.count('locked')}")


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
async def test_a_handler_blocking_the_event_loop_does_not_hold_the_write_lock(
    make_queue: Callable[..., JobQueue], db_url: str,
) -> None:
    """A handler blocks its event loop (synchronous code) just as the heartbeat's write
    transaction is under way. The heartbeat still commits at once and lets go of the file's
    write lock (it runs wholly in a thread), so another process's write is not held up while
    the handler blocks. (The other writer: a plain sqlite3 connection in a thread, busy
    timeout 1 s; the handler blocks for 3 s.)"""
    q = make_queue(heartbeat_interval=0.1)
    in_beat, blocking = threading.Event(), threading.Event()
    outcome: dict[str, Any] = {}

    def spy(_c: Any, _cur: Any, stmt: str, *_: Any) -> None:
        if stmt.startswith("UPDATE") and q._t.workers.name in stmt:
            in_beat.set()  # the beat's transaction is open: it has written a row

    @q.handler("block")
    async def block(ctx: JobContext) -> None:
        in_beat.clear()
        while not in_beat.is_set():  # noqa: ASYNC110 - set from the beat's thread
            await asyncio.sleep(0)
        blocking.set()
        time.sleep(3.0)  # noqa: ASYNC251 - the point: a handler that blocks the loop

    def other_writer() -> None:
        blocking.wait(20)
        time.sleep(0.2)
        con = sqlite3.connect(make_url(db_url).database or "", timeout=1.0,
                              isolation_level=None)
        t0 = time.monotonic()
        try:
            con.execute("BEGIN IMMEDIATE")
            con.execute(f"UPDATE {q._t.meta.name} SET value = value")
            con.execute("COMMIT")
            outcome["wrote_in"] = time.monotonic() - t0
        except sqlite3.OperationalError as exc:
            outcome["error"] = f"{exc} after {time.monotonic() - t0:.1f}s"
        finally:
            con.close()

    async with q:
        engines = [q.engine.sync_engine, q._core.db.ops.side_writer(q.engine)]
        for engine in engines:
            if engine is not None:
                event.listen(engine, "after_cursor_execute", spy)
        writer = threading.Thread(target=other_writer)
        writer.start()
        try:
            jid = await q.enqueue("block", {})
            await q.run_until_idle()
            assert (await q.get(jid)).state == JobState.DONE
        finally:
            writer.join(30)
    assert blocking.is_set()
    assert "wrote_in" in outcome, outcome

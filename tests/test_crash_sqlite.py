"""SQLite with several worker processes on one file: "database is locked" never surfaces as
a crash and no job is ever claimed twice."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable

import pytest
from crashkit import Fleet, fleet_factory  # noqa: F401 - fixture
from sqlalchemy import func, select

from aiojobqueue import JobQueue, JobState


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

"""Scheduling under external limits, proven with several real worker PROCESSES.

Each worker (tests/sched_worker.py) logs every job's run interval (wall-clock start/end, one
clock for all processes on this box). A handler's interval lies inside the job's database
lease (claimed before the handler starts, finalized after it ends), so the overlap of the
logged intervals is a lower bound of what the database counted as running: if it never
exceeds the cap, neither did anything a user could observe.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from schedtools import all_done, kill_and_drain, max_overlap, read_log, spawn, stop, wait_ready
from sqlalchemy import func, select

from aiojobqueue import JobQueue, JobState

pytestmark = pytest.mark.slow


async def _backlog(q: JobQueue, n: int, ms: int, group: str = "default", weight: int = 1,
                   **kw: Any) -> list[int]:
    async with q.batch() as b:
        refs = [b.add("work", {"ms": ms}, group=group, weight=weight, **kw) for _ in range(n)]
    return [r.id for r in refs]


async def _run_procs(q: JobQueue, url: str, tmp_path: Path, opts: list[str], ids: list[int],
                     n: int = 3, limit: float = 60.0) -> list[dict[str, Any]]:
    from conftest import eventually

    log = tmp_path / "intervals.jsonl"
    procs = [spawn(url, q.prefix, log, *opts) for _ in range(n)]
    try:
        await asyncio.to_thread(wait_ready, procs)
        await eventually(lambda: all_done(q, ids), timeout=limit, every=0.2)
    finally:
        await asyncio.to_thread(stop, procs)
    return read_log(log)


async def test_global_cap_across_processes(
    make_queue: Callable[..., JobQueue], db_url: str, tmp_path: Path
) -> None:
    """concurrency=4 with 3 processes of capacity 3 (9 > 4): never above 4, and reaches 4;
    no process ever above its own capacity of 3."""
    q = make_queue(concurrency=4)
    async with q:
        ids = await _backlog(q, 36, ms=150)
        rows = await _run_procs(q, db_url, tmp_path, ["--concurrency", "4", "--capacity", "3"], ids)
    assert sorted(r["id"] for r in rows) == sorted(ids)  # each ran once
    print("global cap: max overlap", max_overlap(rows), "of cap 4;", len(rows), "jobs")
    assert max_overlap(rows) == 4  # never exceeded, and slots were not left idle
    by_pid: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_pid.setdefault(r["pid"], []).append(r)
    assert len(by_pid) >= 2  # the work really was shared between processes
    assert all(max_overlap(v) <= 3 for v in by_pid.values())


async def test_group_cap_across_processes(
    make_queue: Callable[..., JobQueue], db_url: str, tmp_path: Path
) -> None:
    """group_limits={"a": 2} holds fleet-wide; other groups use the remaining slots."""
    q = make_queue(group_limits={"a": 2})
    async with q:
        ids = await _backlog(q, 14, ms=150, group="a") + await _backlog(q, 14, ms=150, group="b")
        rows = await _run_procs(
            q, db_url, tmp_path, ["--capacity", "4", "--group-limits", json.dumps({"a": 2})], ids)
    a = [r for r in rows if r["group"] == "a"]
    b = [r for r in rows if r["group"] == "b"]
    assert len(a) == 14 and len(b) == 14
    assert max_overlap(a) == 2
    assert max_overlap(b) >= 3  # the cap on "a" did not hold back "b"


async def test_rate_limit_across_processes(
    make_queue: Callable[..., JobQueue], db_url: str, tmp_path: Path
) -> None:
    """RateLimit(4, per=1.0) shared by 3 processes: no 1-second window (database clock,
    claim time) holds more than 4 starts, and the rate is actually reached."""
    q = make_queue()
    async with q:
        ids = await _backlog(q, 14, ms=10)
        await _run_procs(q, db_url, tmp_path, ["--capacity", "4", "--rate", "4,1.0"], ids)
        J = q._t.jobs

        async def starts(conn: Any) -> list[float]:
            rows = await conn.execute(select(J.c.started_at).where(J.c.id.in_(ids)))
            return sorted(r[0].timestamp() for r in rows)

        ts = await q._read(starts)
    assert len(ts) == 14
    per_window = [sum(1 for u in ts if t - 1.0 + 1e-3 < u <= t) for t in ts]
    assert max(per_window) <= 4, per_window
    assert max(per_window) == 4
    # 14 starts at 4 per second take at least 3 whole windows
    assert ts[-1] - ts[0] >= 3.0 - 0.05


async def test_rate_limit_holds_when_claims_take_several_starts(
    make_queue: Callable[..., JobQueue], db_url: str, tmp_path: Path
) -> None:
    """RateLimit(10, per=1.0) over 3 processes of capacity 6: claims lease several jobs at
    once (one ledger row holding all their starts, schema v8), and still no 1-second
    window of claim times (database clock) holds more than 10 starts; the rate is reached,
    and the ledger's starts add up to the jobs started."""
    q = make_queue()
    async with q:
        ids = await _backlog(q, 45, ms=10)
        rows = await _run_procs(q, db_url, tmp_path, ["--capacity", "6", "--rate", "10,1.0"],
                                ids)
        J, R = q._t.jobs, q._t.rate

        async def read(conn: Any) -> tuple[list[Any], int]:
            started = [r[0] for r in await conn.execute(
                select(J.c.started_at).where(J.c.id.in_(ids)))]
            ledger = (await conn.execute(select(func.sum(R.c.starts)))).scalar()
            return started, int(ledger or 0)

        started, ledger = await q._read(read)
    assert sorted(r["id"] for r in rows) == sorted(ids)  # each ran once
    assert len({r["pid"] for r in rows}) >= 2  # the processes shared the work
    # one claim's jobs share its statement's timestamp: claims that took several at once
    per_claim = Counter(started)
    assert max(per_claim.values()) > 1, per_claim
    ts = sorted(t.timestamp() for t in started)
    per_window = [sum(1 for u in ts if t - 1.0 + 1e-3 < u <= t) for t in ts]
    print("rate, several starts a claim: claims", len(per_claim), "largest",
          max(per_claim.values()), "max per window", max(per_window))
    assert max(per_window) <= 10, per_window
    assert max(per_window) == 10
    assert ts[-1] - ts[0] >= 4.0 - 0.05  # 45 starts at 10 per second: at least 4 windows
    assert ledger <= 45  # (rows older than 2 s may be swept already)


async def test_sigkilled_worker_frees_its_slots_after_lease_expiry(
    make_queue: Callable[..., JobQueue], db_url: str, tmp_path: Path
) -> None:
    """A SIGKILLed worker's leases keep counting against concurrency until they expire, then
    they are reclaimed and the slots are used again (no slot is held forever)."""
    from conftest import eventually

    q = make_queue(concurrency=2, lease_ttl=2.0)
    async with q:
        hung = await _backlog(q, 2, ms=60_000, max_attempts=1)
        log = tmp_path / "intervals.jsonl"
        p = spawn(db_url, q.prefix, log, "--concurrency", "2", "--capacity", "2",
                  "--lease-ttl", "2.0")
        J = q._t.jobs

        async def running() -> list[Any]:
            return list(await q._read(lambda conn: conn.execute(
                select(J.c.id, J.c.lease_expires).where(J.c.state == "running"))))

        try:
            await asyncio.to_thread(wait_ready, [p])
            await eventually(lambda: _count_is(running, 2), timeout=30)
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
            if p.stdout is not None:
                p.stdout.close()
        expiry = max(r.lease_expires for r in await running())
        after = await _backlog(q, 3, ms=10)

        @q.handler("work")
        async def work(ctx: Any, ms: int) -> None:
            await asyncio.sleep(ms / 1000)

        served = asyncio.create_task(q.serve())
        try:
            await eventually(lambda: all_done(q, after), timeout=30, every=0.1)
        finally:
            served.cancel()
            await asyncio.gather(served, return_exceptions=True)
        for jid in hung:  # reclaimed: the attempt counted as failed (max_attempts=1)
            j = await q.get(jid)
            assert j.state == JobState.FAILED and j.error["type"] == "LeaseExpired"
        for jid in after:  # the dead worker's slots were counted until its leases expired
            started = (await q.get(jid)).started_at
            assert started is not None and started >= expiry


async def test_handed_over_slots_keep_the_cap_with_a_sigkilled_worker(
    make_queue: Callable[..., JobQueue], db_url: str, tmp_path: Path
) -> None:
    """One group under concurrency=4, 3 processes of capacity 3: finishing workers hand
    their freed slots over in the finalize's transaction (no gate). One worker is SIGKILLed
    mid-run: its leases keep counting until they expire and are reclaimed. Never above 4
    running, 4 reached, every job done."""
    from conftest import eventually

    q = make_queue(concurrency=4)
    async with q:
        ids = await _backlog(q, 60, ms=60)
        log = tmp_path / "intervals.jsonl"
        opts = ["--concurrency", "4", "--capacity", "3", "--lease-ttl", "2.0"]
        procs = [spawn(db_url, q.prefix, log, *opts) for _ in range(3)]
        try:
            await asyncio.to_thread(wait_ready, procs)
            await eventually(lambda: len({r["pid"] for r in read_log(log)}) >= 2
                             and len(read_log(log)) >= 12, timeout=30, every=0.02)
            victim = next(p for p in procs if p.pid in {r["pid"] for r in read_log(log)})
            killed_at, dead = await kill_and_drain(q, victim, ids, timeout=60)
        finally:
            await asyncio.to_thread(stop, procs)
    rows = read_log(log)
    assert {r["id"] for r in rows} == set(ids)
    # the dead worker's leases ran (as far as the cap knows) until they expired
    held = [{"start": killed_at, "end": end} for st, end in dead if st == JobState.RUNNING.value]
    print("hand-over with a SIGKILL: max overlap", max_overlap(rows + held), "of cap 4;",
          len(held), "dead leases")
    assert max_overlap(rows + held) <= 4
    assert max_overlap(rows) == 4


async def _count_is(fn: Callable[[], Any], n: int) -> bool:
    return len(await fn()) == n


async def test_fair_share_3_1_1_across_processes(
    make_queue: Callable[..., JobQueue], db_url: str, tmp_path: Path
) -> None:
    """Groups weighted 3:1:1 with deep backlogs, concurrency 10: starts over the saturated
    window follow 60/20/20 within +-15% (relative)."""
    q = make_queue(concurrency=10)
    async with q:
        for g, w, n in (("heavy", 3, 300), ("light1", 1, 120), ("light2", 1, 120)):
            await _backlog(q, n, ms=200, group=g, weight=w)
        log = tmp_path / "intervals.jsonl"
        procs = [spawn(db_url, q.prefix, log, "--concurrency", "10", "--capacity", "5")
                 for _ in range(3)]
        try:
            await asyncio.to_thread(wait_ready, procs)
            t0 = time.time()
            await asyncio.sleep(4.0)  # a fixed observation window: the backlogs outlast it
        finally:
            await asyncio.to_thread(stop, procs)
    rows = read_log(log)
    assert max_overlap(rows) <= 10
    # the saturated window: after the first second, before the first worker was told to stop
    lo, hi = t0 + 1.0, t0 + 4.0
    starts = Counter(r["group"] for r in rows if lo <= r["start"] < hi)
    total = sum(starts.values())
    busy = sum(max(0.0, min(r["end"], hi) - max(r["start"], lo)) for r in rows)
    print("fair share starts in window:", dict(starts),
          f"slot utilization {busy / (10 * (hi - lo)):.0%}")
    assert total >= 40, starts
    for g, w in (("heavy", 3), ("light1", 1), ("light2", 1)):
        share, want = starts[g] / total, w / 5
        assert abs(share - want) <= 0.15 * want, (starts, g, share, want)
    # every group still had work when the window closed (it really was saturated)
    assert {g for g, _ in Counter(r["group"] for r in rows).items()} == {"heavy", "light1",
                                                                         "light2"}

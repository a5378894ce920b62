"""Held slots (issue 18): under a counted cap, workers lease jobs ahead as ``leased`` (counted
by no cap) and start one only in a slot of their own whose job just ended; the round that
writes that job's outcome makes the held row ``running`` first. Proven with several real
worker PROCESSES (tests/sched_worker.py), interval logs and a SIGKILL: the cap is never
exceeded, a dead worker's ``leased`` and ``running`` rows come back, nothing is lost and no
job is finished twice.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from schedtools import kill_and_drain, max_overlap, read_log, spawn, stop, wait_ready
from sqlalchemy import func, select

from aiojobqueue import JobQueue, JobState

pytestmark = pytest.mark.slow


async def _backlog(q: JobQueue, n: int, ms: int, group: str = "default") -> list[int]:
    async with q.batch() as b:
        refs = [b.add("work", {"ms": ms}, group=group) for _ in range(n)]
    return [r.id for r in refs]


async def _states(q: JobQueue, ids: list[int]) -> Counter[str]:
    J = q._t.jobs

    async def read(conn: Any) -> Counter[str]:
        rows = await conn.execute(select(J.c.state, func.count()).where(J.c.id.in_(ids))
                                  .group_by(J.c.state))
        return Counter({r[0]: int(r[1]) for r in rows})

    return await q._read(read)


async def _held_by_pid(q: JobQueue) -> dict[int, int]:
    """Leased (held) rows per worker process."""
    J, W = q._t.jobs, q._t.workers

    async def read(conn: Any) -> dict[int, int]:
        rows = await conn.execute(
            select(W.c.pid, func.count()).select_from(J.join(W, W.c.id == J.c.lease_owner))
            .where(J.c.state == JobState.LEASED.value).group_by(W.c.pid))
        return {int(r[0]): int(r[1]) for r in rows}

    return await q._read(read)


async def test_held_slots_keep_the_cap_across_processes_with_a_sigkilled_worker(
    make_queue: Callable[..., JobQueue], db_url: str, tmp_path: Path
) -> None:
    """One group of 20 ms jobs under concurrency=4, 3 processes of capacity 3: the workers
    hold jobs ahead (``leased``) and swap them into their own freed slots. One worker is
    SIGKILLed while it holds some: its running rows count until they expire, then its
    running and leased rows are reclaimed and run again. Never above 4 at once (the dead
    worker's running rows included until their expiry), 4 reached,
    every job done exactly once in the database, no job's runs overlapping."""
    from conftest import eventually

    q = make_queue(concurrency=4)
    async with q:
        ids = await _backlog(q, 400, ms=20)
        log = tmp_path / "intervals.jsonl"
        opts = ["--concurrency", "4", "--capacity", "3", "--lease-ttl", "2.0"]
        procs = [spawn(db_url, q.prefix, log, *opts) for _ in range(3)]
        seen_held: dict[int, int] = {}
        try:
            await asyncio.to_thread(wait_ready, procs)
            pids = {p.pid for p in procs}

            async def someone_holds() -> bool:
                held = {pid: n for pid, n in (await _held_by_pid(q)).items() if pid in pids}
                seen_held.update(held)
                return bool(held) and len(read_log(log)) >= 40

            await eventually(someone_holds, timeout=30, every=0.005)
            victim_pid = max(seen_held, key=lambda pid: seen_held[pid])
            victim = next(p for p in procs if p.pid == victim_pid)
            killed_at, dead = await kill_and_drain(q, victim, ids, timeout=90)
        finally:
            await asyncio.to_thread(stop, procs)
        states = await _states(q, ids)
        J = q._t.jobs
        attempts = dict((await q._read(lambda conn: conn.execute(
            select(J.c.id, J.c.attempts).where(J.c.id.in_(ids))))).all())
    rows = read_log(log)
    print("held slots with a SIGKILL: max overlap", max_overlap(rows), "of cap 4; dead rows",
          Counter(s for s, _ in dead), "held seen", seen_held)
    assert states == Counter({JobState.DONE.value: len(ids)})  # nothing lost, nothing stuck
    assert {r["id"] for r in rows} == set(ids)
    assert any(s == JobState.LEASED.value for s, _ in dead)  # it died holding jobs ahead
    # the dead worker's running rows ran (as far as the cap knows) until they expired; its
    # held ones ran only in the place of one of those (one made running in the same
    # transaction that finished the job whose slot it took), so they add nothing
    counted = [{"start": killed_at, "end": end} for s, end in dead if s == JobState.RUNNING.value]
    assert max_overlap(rows + counted) <= 4
    assert max_overlap(rows) == 4
    # each job's runs (a reclaimed one runs again) never overlap: no job ran twice at once
    by_id: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_id.setdefault(r["id"], []).append(r)
    for runs in by_id.values():
        assert max_overlap(runs) == 1
    # every run but the dead worker's last ones finished its job once: the reruns are of
    # the jobs it held or ran when it died, one attempt more each
    reruns = [jid for jid, runs in by_id.items() if len(runs) > 1]
    assert len(reruns) <= len(dead)
    assert all(attempts[jid] >= 2 for jid in reruns)

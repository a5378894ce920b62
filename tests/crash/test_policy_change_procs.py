"""A lowered cap is never exceeded by claims made after it was seen (issue 31): 3 real
worker PROCESSES (tests/sched_worker.py) drain one group under the stored ``concurrency=8``;
mid-drain the cap is lowered to 2 through the database. Each worker logs when it applied
the change (``--policy-log``) and every attempt's start and end (the interval log).

What must hold (docs/scheduling.md "Changing the policy"): jobs already running finish; a
claim already under way when its worker saw the change may still lease under 8 (one claim
round); no held job is swapped in and no hand-over is made from then on. So every job that
starts later than ROUND after the last worker saw the change starts with at most 2 running,
itself included, counting the jobs started before the change that still run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from schedtools import all_done, max_overlap, read_log, spawn, stop, wait_ready

from aiojobqueue import JobQueue

pytestmark = pytest.mark.slow

#: one claim round, with room for this loaded 2-core machine (a round is milliseconds;
#: a claim that began before its worker saw the change ends within it)
ROUND = 0.5


def running_at(rows: list[dict[str, Any]], t: float) -> int:
    """Attempts open at instant ``t`` (start <= t < end)."""
    return sum(1 for r in rows if r["start"] <= t < r["end"])


async def test_lowered_cap_holds_for_claims_after_it_was_seen(
    make_queue: Callable[..., JobQueue], db_url: str, tmp_path: Path,
) -> None:
    from conftest import eventually

    q = make_queue()
    async with q:
        await q.set_policy(concurrency=8)
        async with q.batch() as b:
            refs = [b.add("work", {"ms": 40}, group="g") for _ in range(260)]
        ids = [r.id for r in refs]
        log, plog = tmp_path / "intervals.jsonl", tmp_path / "policy.jsonl"
        procs = [spawn(db_url, q.prefix, log, "--capacity", "4", "--policy-log", str(plog))
                 for _ in range(3)]
        try:
            await asyncio.to_thread(wait_ready, procs)
            await eventually(lambda: len(read_log(log)) >= 60, timeout=60, every=0.01)
            changed_at = time.time()
            await q.set_policy(concurrency=2)
            pids = {p.pid for p in procs}
            await eventually(lambda: {r["pid"] for r in read_log(plog)
                                      if r["concurrency"] == 2} >= pids, timeout=10)
            await eventually(lambda: all_done(q, ids), timeout=120, every=0.05)
        finally:
            await asyncio.to_thread(stop, procs)
    rows = read_log(log)
    seen = {r["pid"]: r["seen"] for r in read_log(plog) if r["concurrency"] == 2}
    last_seen = max(seen.values())
    before = [r for r in rows if r["start"] < changed_at]
    after = [r for r in rows if r["start"] >= last_seen + ROUND]
    worst = max(running_at(rows, r["start"]) for r in after)
    print(f"cap 8 -> 2: {len(before)} started before the change (max overlap "
          f"{max_overlap(before)}), seen by every worker {last_seen - changed_at:.3f}s after "
          f"it; {len(after)} started after that + {ROUND}s, at most {worst} running at any "
          f"of their starts; running at the change {running_at(rows, changed_at)}")
    assert {r["id"] for r in rows} == set(ids)
    assert max_overlap(before) > 2  # the old cap was in use (8 at best on this machine)
    assert len(after) > 50
    assert worst <= 2  # the lowered cap holds for every later start
    # and once the jobs running at that moment have ended, never more than 2 at once
    quiet = max((r["end"] for r in rows if r["start"] < last_seen + ROUND), default=0.0)
    assert max_overlap([r for r in rows if r["start"] >= quiet]) <= 2

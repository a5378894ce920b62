"""Periodic jobs: one job per slot across several worker processes, never re-enqueued."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from schedtools import read_log, spawn, stop, wait_ready
from sqlalchemy import select

from aiojobqueue import ConfigurationError, InvalidJobError, JobQueue, NotJSONError
from aiojobqueue.periodic import Schedule, enqueue_slot, make_schedule, slot_iso


async def slot_in(q: JobQueue, conn: Any, s: Schedule, slot: datetime) -> int | None:
    """enqueue_slot on ``q``'s database, in the caller's transaction."""
    assert q._core is not None
    return await enqueue_slot(q._core.db, lambda c: q.batch(connection=c), conn, s=s, slot=slot)


def test_every_slots_are_epoch_aligned_and_strictly_after() -> None:
    s = make_schedule("t", type="x", every=timedelta(seconds=5))
    t = datetime(2026, 1, 1, 10, 0, 7, 500_000, tzinfo=UTC)
    assert s.next_after(t) == datetime(2026, 1, 1, 10, 0, 10, tzinfo=UTC)
    assert s.next_after(datetime(2026, 1, 1, 10, 0, 10, tzinfo=UTC)) == datetime(
        2026, 1, 1, 10, 0, 15, tzinfo=UTC)


def test_cron_slots() -> None:
    s = make_schedule("c", type="x", cron="*/5 * * * *")
    t = datetime(2026, 1, 1, 10, 7, 30, tzinfo=UTC)
    assert s.next_after(t) == datetime(2026, 1, 1, 10, 10, tzinfo=UTC)
    assert s.key(s.next_after(t)) == "cron:c:2026-01-01T10:10:00.000000Z"


@pytest.mark.parametrize("kw", [
    {},                                              # neither every nor cron
    {"every": 1.0, "cron": "* * * * *"},             # both
    {"cron": "not a cron"},
    {"every": 0.0},
    {"every": float("nan")},
    {"every": 1.0, "args": {"x": object()}},         # not JSON
    {"every": 1.0, "colour": "red"},                 # unknown option
])
def test_bad_schedules_are_rejected(kw: dict[str, Any]) -> None:
    with pytest.raises((ConfigurationError, NotJSONError)):
        make_schedule("s", type="x", **kw)


def test_bad_names_and_duplicates_are_rejected() -> None:
    q = JobQueue("sqlite+aiosqlite:///unused.db")
    for bad in ("", "a:b", "x" * 51):
        with pytest.raises(ConfigurationError):
            q.periodic(bad, type="x", every=1.0)
    q.periodic("ok", type="x", every=1.0)
    with pytest.raises(ConfigurationError):
        q.periodic("ok", type="x", every=2.0)


async def test_slot_is_enqueued_once_even_after_its_job_finished(queue: JobQueue) -> None:
    """The uniqueness key only covers LIVE jobs; the high-water mark covers finished ones."""
    ran: list[int] = []

    @queue.handler("beat")
    async def beat(ctx: Any) -> None:
        ran.append(ctx.job_id)

    s = make_schedule("hb", type="beat", every=1.0, priority=5)
    slot = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)  # already due
    first = await queue._write(lambda c: slot_in(queue, c, s, slot))
    assert first is not None
    assert await queue._write(lambda c: slot_in(queue, c, s, slot)) is None
    await queue.run_until_idle()
    assert ran == [first]
    job = await queue.get(first)
    assert job.key == f"cron:hb:{slot_iso(slot)}" and job.priority == 5
    # finished: the key is free again, but the mark still refuses this slot and earlier ones
    assert await queue._write(lambda c: slot_in(queue, c, s, slot)) is None
    assert await queue._write(
        lambda c: slot_in(queue, c, s, slot - timedelta(seconds=1))) is None
    later = await queue._write(lambda c: slot_in(queue, c, s, slot + timedelta(seconds=1)))
    assert later is not None and later != first


@pytest.mark.slow
async def test_one_job_per_slot_across_three_processes(
    make_queue: Callable[..., JobQueue], db_url: str, tmp_path: Path
) -> None:
    q = make_queue()
    async with q:
        log = tmp_path / "intervals.jsonl"
        procs = [spawn(db_url, q.prefix, log, "--every", "1.0") for _ in range(3)]
        try:
            await asyncio.to_thread(wait_ready, procs)
            await asyncio.sleep(6.0)
        finally:
            await asyncio.to_thread(stop, procs)
        J = q._t.jobs
        rows = list(await q._read(lambda c: c.execute(
            select(J.c.id, J.c.key, J.c.run_after, J.c.state).order_by(J.c.run_after))))
    keys = Counter(r.key for r in rows)
    assert all(n == 1 for n in keys.values()), keys  # no slot enqueued twice
    slots = [r.run_after for r in rows]
    assert len(slots) >= 5, slots
    gaps = {(b - a).total_seconds() for a, b in itertools.pairwise(slots)}
    assert gaps == {1.0}, slots  # no slot skipped
    assert all(r.key == f"cron:tick:{slot_iso(r.run_after)}" for r in rows)
    runs = Counter(r["id"] for r in read_log(log))
    done = [r.id for r in rows if r.state == "done"]
    assert len(done) >= 4 and all(runs[i] == 1 for i in done)
    assert sum(runs.values()) == len(done)  # nothing ran twice, nothing ran unrecorded


def test_bad_job_options_fail_at_registration() -> None:
    q = JobQueue("sqlite+aiosqlite:///unused.db")
    with pytest.raises(InvalidJobError):
        q.periodic("w", type="x", every=1.0, weight=0)
    with pytest.raises(InvalidJobError):
        q.periodic("w", type="x", every=1.0, group="")
    assert q._schedules == {}

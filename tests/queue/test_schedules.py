"""Schedules as rows (v10): time zones and daylight saving, declaration at start,
pause/resume/trigger from the API, the command line and across worker processes."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from clikit import acli, one_line_error
from schedtools import read_log, stop, wait_ready
from sqlalchemy import delete, insert, select, update

from aiojobqueue import ConfigurationError, JobQueue, ScheduleNotFoundError
from aiojobqueue.periodic import make_schedule, run_schedules, slot_iso

PARIS = "Europe/Paris"
CLOCK_WORKER = str(Path(__file__).resolve().parent.parent / "clock_worker.py")


def z(s: str) -> datetime:
    return datetime.fromisoformat(s).replace(tzinfo=UTC)


def slots(cron: str, tz: str, start: str, n: int) -> list[datetime]:
    s = make_schedule("x", type="t", cron=cron, tz=tz)
    out, t = [], z(start)
    for _ in range(n):
        t = s.next_after(t)
        out.append(t)
    return out


# -- daylight saving, computed ---------------------------------------------------------------
def test_a_wall_time_that_does_not_exist_is_skipped() -> None:
    # 2026-03-29 in Paris: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist that day
    assert slots("30 2 * * *", PARIS, "2026-03-27T12:00", 3) == [
        z("2026-03-28T01:30"),  # 02:30 CET (+1)
        z("2026-03-30T00:30"),  # 02:30 CEST (+2): the 29th has no 02:30
        z("2026-03-31T00:30")]
    # an hourly cron simply has no 02:xx slot that night
    assert slots("0 * * * *", PARIS, "2026-03-29T00:30", 3) == [
        z("2026-03-29T01:00"), z("2026-03-29T02:00"), z("2026-03-29T03:00")]  # 02:00->03:00+2


def test_a_wall_time_that_repeats_runs_once_at_its_first_occurrence() -> None:
    # 2026-10-25 in Paris: 03:00 CEST goes back to 02:00 CET; 02:00-02:59 happens twice
    assert slots("30 2 * * *", PARIS, "2026-10-24T12:00", 2) == [
        z("2026-10-25T00:30"),  # 02:30 CEST, the first 02:30; the second (01:30Z) is none
        z("2026-10-26T01:30")]
    assert slots("*/30 * * * *", PARIS, "2026-10-24T23:40", 5) == [
        z("2026-10-25T00:00"), z("2026-10-25T00:30"),  # 02:00, 02:30 CEST
        z("2026-10-25T02:00"), z("2026-10-25T02:30"),  # 03:00, 03:30 CET: the repeated
        z("2026-10-25T03:00")]                         # 02:00, 02:30 CET are skipped
    # from inside the repeated hour (02:10 CET, the second pass), the next slot is 03:00
    s = make_schedule("x", type="t", cron="*/30 * * * *", tz=PARIS)
    assert s.next_after(z("2026-10-25T01:10")) == z("2026-10-25T02:00")


def test_utc_and_other_zones() -> None:
    assert slots("0 9 * * *", "America/New_York", "2026-01-10T00:00", 1) == [
        z("2026-01-10T14:00")]
    assert slots("0 9 * * *", "UTC", "2026-01-10T00:00", 1) == [z("2026-01-10T09:00")]
    no_tz = make_schedule("x", type="t", cron="0 9 * * *")
    assert no_tz.next_after(z("2026-01-10T00:00")) == z("2026-01-10T09:00")


@pytest.mark.parametrize("kw", [
    {"cron": "0 * * * *", "tz": "Mars/Olympus"},
    {"cron": "0 * * * *", "tz": ""},
    {"cron": "0 * * * *", "tz": 5},
    {"cron": "0 * * * *", "tz": "../../etc/passwd"},
    {"every": 60.0, "tz": PARIS},        # every= is epoch-aligned: a zone means nothing
])
def test_bad_zones_are_refused_at_registration(kw: dict[str, Any]) -> None:
    q = JobQueue("sqlite+aiosqlite:///unused.db")
    with pytest.raises(ConfigurationError):
        q.periodic("s", type="t", **kw)
    assert q._schedules == {}


# -- rows ----------------------------------------------------------------------------------
async def rows(q: JobQueue) -> dict[str, Any]:
    T = q._t.schedules
    return {r.name: r for r in await q._read(lambda c: c.execute(select(T)))}


async def test_start_declares_the_code_where_it_differs_and_logs_it(
        make_queue: Callable[..., JobQueue], caplog: pytest.LogCaptureFixture) -> None:
    q1 = make_queue()
    q1.periodic("report", type="t", cron="0 7 * * 1-5", tz=PARIS, args={"n": 1}, priority=3)
    q1.periodic("tick", type="t", every=60.0)
    async with q1:
        r = await rows(q1)
        assert (r["report"].cron, r["report"].tz, r["report"].args) == (
            "0 7 * * 1-5", PARIS, {"n": 1})
        assert r["report"].options == {"priority": 3} and r["tick"].every == 60.0
        assert await q1.pause_schedule("report") is True
    caplog.clear()
    q2 = make_queue()  # the next deployment: report moved to 08:00, tick unchanged
    q2.periodic("report", type="t", cron="0 8 * * 1-5", tz=PARIS, args={"n": 1}, priority=3)
    q2.periodic("tick", type="t", every=60.0)
    with caplog.at_level(logging.INFO, logger="aiojobqueue"):
        async with q2:
            r = await rows(q2)
            assert r["report"].cron == "0 8 * * 1-5"
            assert r["report"].paused  # the operator's pause survives a declaration
    changed = [m for m in caplog.messages if "schedule" in m]
    assert len(changed) == 1 and "report" in changed[0] and "0 7 * * 1-5" in changed[0] \
        and "0 8 * * 1-5" in changed[0], caplog.messages
    q3 = make_queue()  # a command-line tool: starts without schedules, writes none
    async with q3:
        assert set(await rows(q3)) == {"report", "tick"}


async def test_pause_cancels_the_slot_enqueued_ahead_and_resume_restores_it(
        make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()
    q.periodic("hourly", type="t", cron="0 * * * *", tz=PARIS)
    async with q:
        core = q._started()
        J = q._t.jobs
        now = datetime.now(UTC)
        s = core.schedules["hourly"]
        ahead = s.next_after(now)
        task = asyncio.create_task(run_schedules(core.db, core.schedules, core.batch_on,
                                                 poll=0.05))
        try:
            async def slot_jobs() -> list[Any]:
                return list(await q._read(lambda c: c.execute(
                    select(J.c.id, J.c.state, J.c.key).where(J.c.type == "t")
                    .order_by(J.c.id))))

            from conftest import eventually
            await eventually(lambda: slot_jobs())
            [first] = await slot_jobs()
            assert first.key == f"cron:hourly:{slot_iso(ahead)}" and first.state == "scheduled"
            [info] = await q.schedules()
            assert (info.paused, info.last_slot, info.next_slot) == (False, ahead, ahead)
            assert await q.pause_schedule("hourly") is True
            assert await q.pause_schedule("hourly") is False
            assert (await q.get(first.id)).state.value == "cancelled"
            await asyncio.sleep(0.3)  # several turns of the loop: nothing enqueued
            assert len(await slot_jobs()) == 1
            [info] = await q.schedules()
            assert info.paused and info.next_slot is None
            assert await q.resume_schedule("hourly") is True
            assert await q.resume_schedule("hourly") is False
            await eventually(lambda: _count(slot_jobs, 2))
            again = (await slot_jobs())[1]
            assert again.key == first.key and again.state == "scheduled"  # the same slot
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def _count(read: Callable[[], Any], n: int) -> bool:
    return len(await read()) == n


async def test_trigger_enqueues_one_job_now_and_errors_are_typed(
        make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()
    q.periodic("nightly", type="t", cron="0 3 * * *", tz=PARIS, args={"full": True},
               group="ops")
    ran: list[dict[str, Any]] = []

    @q.handler("t")
    async def t(ctx: Any, full: bool) -> None:
        ran.append({"full": full, "group": ctx.group})

    async with q:
        await q.pause_schedule("nightly")  # a trigger runs even while paused
        jid = await q.trigger_schedule("nightly")
        job = await q.get(jid)
        assert job.key is not None and job.key.startswith("cron:nightly:now:")
        await q.run_until_idle()
        assert ran == [{"full": True, "group": "ops"}]
        [info] = await q.schedules()
        assert info.paused and info.last_slot is None  # the slots were not touched
        before = await rows(q)
        for bad in ("nope", "", "a:b", "x" * 51, 7):
            for act in (q.pause_schedule, q.resume_schedule, q.trigger_schedule):
                with pytest.raises(ScheduleNotFoundError):
                    await act(bad)  # type: ignore[arg-type]
        assert await rows(q) == before  # nothing changed


async def test_sync_queue_has_the_schedule_api(
        make_queue: Callable[..., JobQueue], db_url: str, prefix: str) -> None:
    from aiojobqueue import SyncQueue

    q = make_queue()
    q.periodic("nightly", type="t", cron="0 3 * * *", tz=PARIS)
    async with q:
        with SyncQueue(db_url, prefix=prefix) as sq:
            assert sq.pause_schedule("nightly") is True
            assert [(s.name, s.tz, s.paused) for s in sq.schedules()] == [
                ("nightly", PARIS, True)]
            assert sq.resume_schedule("nightly") is True
            jid = sq.trigger_schedule("nightly")
            assert sq.get(jid).type == "t"
            with pytest.raises(ScheduleNotFoundError):
                sq.trigger_schedule("nope")
        assert not (await q.schedules())[0].paused


async def test_the_command_line_refuses_an_unknown_schedule_in_one_line(
        make_queue: Callable[..., JobQueue], db_url: str) -> None:
    q = make_queue()
    q.periodic("nightly", type="t", cron="0 3 * * *", tz=PARIS)
    async with q:
        base = ["--url", db_url, "--prefix", q.prefix]
        for act in ("pause", "resume", "trigger"):
            one_line_error(await acli("schedule", act, "nope", *base), 1,
                           "no schedule named 'nope'")
        assert not (await q.schedules())[0].paused


async def test_v9_marks_become_rows_on_upgrade(make_queue: Callable[..., JobQueue]) -> None:
    """A v9 database kept each schedule's mark in meta (``cron:<name>``): the upgrade moves
    it into the schedules table, so no slot already enqueued is enqueued again."""
    q = make_queue()
    async with q:
        M, T = q._t.meta, q._t.schedules
        mark = "2026-12-06T10:00:00.000000Z"

        async def to_v9(c: Any) -> None:
            await c.run_sync(T.drop)
            await c.execute(insert(M).values(name="cron:old", value=mark))
            await c.execute(update(M).where(M.c.name == "schema_version").values(value="9"))

        await q._write(to_v9)
    q2 = make_queue()
    q2.periodic("old", type="t", every=3600.0)
    async with q2:
        r = (await rows(q2))["old"]
        assert (r.last_slot, r.type, r.every) == (mark, "t", 3600.0)
        s = q2._started().schedules["old"]
        T = q2._t.schedules
        assert await q2._write(lambda c: _enqueue(q2, c, s, z("2026-12-06T10:00"))) is None
        await q2._write(lambda c: c.execute(delete(T)))


async def _enqueue(q: JobQueue, conn: Any, s: Any, slot: datetime) -> int | None:
    from aiojobqueue.periodic import enqueue_slot

    core = q._started()
    return await enqueue_slot(core.db, core.batch_on, conn, s=s, slot=slot)


# -- across processes, a daylight-saving change and the command line ------------------------
def spawn_clocked(url: str, prefix: str, log: Path, start: str, t0: Path,
                  speed: float) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen(
        [sys.executable, CLOCK_WORKER, url, prefix, str(log), start, str(t0), str(speed),
         "*/30 * * * *", PARIS],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)


@pytest.mark.slow
async def test_three_workers_cross_the_fall_back_and_obey_the_command_line(
        make_queue: Callable[..., JobQueue], db_url: str, tmp_path: Path) -> None:
    """Three worker processes share a clock that crosses 2026-10-25 in Paris (03:00 CEST
    back to 02:00 CET) at 5 minutes per second: every half-hour slot is enqueued once
    (the repeated 02:00 and 02:30 not at all) and run once. Then `schedule pause` from the
    command line stops all three, `resume` restarts them, `trigger` runs one job now."""
    # a slot every 6 s of real time: on a loaded machine (load 20+ on 2 cores) faster
    # clocks saw all three workers miss a slot's whole period, which skips it (no backfill)
    start, speed = "2026-10-25T00:20:00+00:00", 300.0
    q = make_queue()
    async with q:
        J = q._t.jobs
        log = tmp_path / "runs.jsonl"
        t0_file = tmp_path / "t0"  # the clock stands until every worker is up
        procs = [spawn_clocked(db_url, q.prefix, log, start, t0_file, speed)
                 for _ in range(3)]
        base = ["--url", db_url, "--prefix", q.prefix]

        t0 = float("inf")

        def fake_now() -> datetime:
            return z(start[:19]) + timedelta(seconds=max(time.time() - t0, 0.0) * speed)

        async def all_jobs() -> list[Any]:
            return list(await q._read(lambda c: c.execute(
                select(J.c.id, J.c.key, J.c.run_after, J.c.state).order_by(J.c.id))))

        try:
            await asyncio.to_thread(wait_ready, procs)
            t0 = time.time()
            (tmp_path / "t0.tmp").write_text(repr(t0))
            (tmp_path / "t0.tmp").rename(t0_file)  # atomic: no worker reads half of it
            until = (z("2026-10-25T03:10") - z(start[:19])).total_seconds() / speed
            await asyncio.sleep(t0 + until - time.time())
            p = await acli("schedule", "pause", "paris", *base)
            assert p.returncode == 0 and "paused" in p.stdout, p.stderr
            paused_at = fake_now()  # the pause took effect before this
            before = await all_jobs()
            await asyncio.sleep(12.0)  # an hour of schedule time: two slots at least
            during = await all_jobs()
            listed = await acli("schedules", *base)
            assert "paris" in listed.stdout and "paused" in listed.stdout, listed.stdout
            resume_called = fake_now()  # the resume took effect after this
            p = await acli("schedule", "resume", "paris", *base)
            assert p.returncode == 0 and "resumed" in p.stdout, p.stderr
            await asyncio.sleep(8.0)  # 40 minutes: a slot at least
            p = await acli("schedule", "trigger", "paris", "--json", *base)
            assert p.returncode == 0, p.stderr
            import json
            triggered = json.loads(p.stdout)["job_id"]
            await asyncio.sleep(2.0)
        finally:
            await asyncio.to_thread(stop, procs)
        after = await all_jobs()

    # nothing was enqueued while paused, by any of the three (slot jobs here are due at
    # once: this clock is weeks behind the database's, so none was cancelled by the pause)
    assert [r.id for r in during] == [r.id for r in before], (before, during)
    slot_rows = [r for r in after if r.key.startswith("cron:paris:2")]
    live = [r for r in slot_rows if r.state != "cancelled"]
    keys = Counter(r.key for r in live)
    assert all(n == 1 for n in keys.values()), keys  # no slot enqueued twice
    assert all(r.key == f"cron:paris:{slot_iso(r.run_after)}" for r in slot_rows)
    # up to the last slot enqueued before the pause: every half hour from 02:30 summer time,
    # but 02:00 and 02:30 winter time (the repeat) are no slots
    cut = max(r.run_after for r in before if r.key.startswith("cron:paris:2"))
    assert cut >= z("2026-10-25T03:00"), cut  # the change of the clocks was crossed
    got = sorted(r.run_after for r in live if r.run_after <= cut)
    half_hours = [z("2026-10-25T00:30") + timedelta(minutes=30 * i) for i in range(96)]
    want = [t for t in half_hours if t not in (z("2026-10-25T01:00"), z("2026-10-25T01:30"))
            and t <= cut]
    assert got == want, (got, want)
    # the slots that passed while surely paused were skipped (no backfill), and slots came
    # again after the resume
    skipped = [t for t in half_hours if paused_at + timedelta(minutes=30) < t <= resume_called]
    assert skipped and not [r for r in live if r.run_after in skipped], (skipped, live)
    assert [r for r in live if r.run_after > resume_called]
    runs = Counter(r["id"] for r in read_log(log))
    done = [r.id for r in after if r.state == "done"]
    assert set(runs) == set(done) and all(n == 1 for n in runs.values()), runs
    assert triggered in done and len(live) >= len(want) + 1

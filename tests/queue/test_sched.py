"""The ranked claim in one process: priorities, run_after, per-process capacity, a newcomer
behind a deep backlog, weights of a group, and custom limits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from conftest import eventually
from sqlalchemy import select

from aiojobqueue import JobQueue, JobState, Limit


async def _serving(q: JobQueue) -> asyncio.Task[None]:
    return asyncio.create_task(q.serve())


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_priority_then_age_within_a_group_and_run_after(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue(capacity=1)
    order: list[str] = []
    async with q:
        @q.handler("step")
        async def step(ctx: Any, name: str) -> None:
            order.append(name)

        ids = {}
        for name, prio in (("a", 0), ("b", 5), ("c", 5), ("d", -1)):
            ids[name] = await q.enqueue("step", {"name": name}, priority=prio)
        # due well after the four have run, however loaded the machine
        late = await q.enqueue("step", {"name": "late"}, priority=100, run_after=3.0)
        await q.run_until_idle()  # jobs delayed by run_after do not keep it running
        assert order == ["b", "c", "a", "d"]  # higher priority first, then oldest first
        assert (await q.get(late)).state == JobState.SCHEDULED
        task = await _serving(q)
        try:
            assert await q.wait(late, timeout=15) is None
        finally:
            await _stop(task)
        j = await q.get(late)
        assert j.started_at is not None and j.run_after is not None
        assert j.started_at >= j.run_after  # never before its time (database clock)


async def test_per_process_capacity(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue(capacity=2)
    live = peak = 0
    async with q:
        @q.handler("w")
        async def w(ctx: Any) -> None:
            nonlocal live, peak
            live += 1
            peak = max(peak, live)
            try:
                await asyncio.sleep(0.05)
            finally:  # a stopped attempt (a lease lost under load) is no longer running
                live -= 1

        async with q.batch() as b:
            for _ in range(10):
                b.add("w", {})
        await q.run_until_idle()
    assert peak == 2


async def test_newcomer_starts_within_a_tick_behind_a_10k_backlog(
    make_queue: Callable[..., JobQueue],
) -> None:
    """A weight-1 group enqueuing one job behind another group's 10,000-job backlog gets the
    next free slot: the split counts what each group runs, not how much it has waiting."""
    q = make_queue(concurrency=4, capacity=4, poll_interval=0.5)
    started: dict[str, float] = {}
    async with q:
        @q.handler("bulk")
        async def bulk(ctx: Any) -> None:
            await asyncio.sleep(0.2)

        @q.handler("tiny")
        async def tiny(ctx: Any) -> None:
            started["tiny"] = time.monotonic()

        async with q.batch() as b:
            for _ in range(10_000):
                b.add("bulk", {}, group="bulk", weight=5)
        J = q._t.jobs

        async def running() -> int:
            return len((await q._read(lambda c: c.execute(
                select(J.c.id).where(J.c.state == "running")))).all())

        task = await _serving(q)
        try:
            await eventually(lambda: _eq(running, 4), timeout=20)
            t0 = time.monotonic()
            jid = await q.enqueue("tiny", {}, group="tiny")
            await q.wait(jid, timeout=20)
        finally:
            await _stop(task)
    latency = started["tiny"] - t0
    print(f"newcomer behind 10k backlog started after {latency * 1000:.0f} ms")
    assert latency < 1.0  # about one tick (0.5 s); slots free every ~50 ms here


async def _eq(fn: Callable[[], Any], n: int) -> bool:
    return bool(await fn() == n)


async def test_group_weight_is_the_largest_among_its_runnable_jobs(
    make_queue: Callable[..., JobQueue],
) -> None:
    """Group "a" has one weight-3 job among weight-1 jobs: it counts as weight 3, so with 4
    free slots it gets 3 and "b" (weight 1) gets 1."""
    q = make_queue(concurrency=4, capacity=4)
    async with q:
        @q.handler("w")
        async def w(ctx: Any) -> None: ...

        async with q.batch() as b:
            for i in range(6):
                b.add("w", {}, group="a", weight=3 if i == 5 else 1)
            for _ in range(6):
                b.add("w", {}, group="b", weight=1)
        got = await q._write(lambda c: q._core.claimer.claim(c, 4, ["w"]))
    by_group = sorted(c.group for c in got)
    assert by_group == ["a", "a", "a", "b"]


async def test_group_cap_and_zero_cap_pauses_a_group(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue(group_limits={"paused": 0, "two": 2})
    async with q:
        @q.handler("w")
        async def w(ctx: Any) -> None: ...

        async with q.batch() as b:
            for g in ("paused", "two", "free"):
                for _ in range(5):
                    b.add("w", {}, group=g)
        got = await q._write(lambda c: q._core.claimer.claim(c, 10, ["w"]))
    groups = sorted(c.group for c in got)
    assert groups.count("paused") == 0 and groups.count("two") == 2
    assert groups.count("free") == 5  # the capped groups' share went to the free one


class _Budget(Limit):
    """A local limit: at most ``n`` jobs in flight in this process, counted via the hooks."""

    def __init__(self, n: int) -> None:
        self.n, self.live, self.peak, self.events = n, 0, 0, []  # type: ignore[var-annotated]

    async def available(self) -> int:
        return self.n - self.live

    def on_start(self, job_type: str, group: str) -> None:
        self.live += 1
        self.peak = max(self.peak, self.live)
        self.events.append(("start", job_type, group))

    def on_finish(self, job_type: str, group: str) -> None:
        self.live -= 1
        self.events.append(("finish", job_type, group))


async def test_custom_limit_caps_what_starts(make_queue: Callable[..., JobQueue]) -> None:
    budget = _Budget(2)
    q = make_queue(capacity=10, limits=[budget])
    async with q:
        @q.handler("w")
        async def w(ctx: Any) -> None:
            await asyncio.sleep(0.05)

        async with q.batch() as b:
            for _ in range(8):
                b.add("w", {}, group="g")
        await q.run_until_idle()
    assert budget.peak == 2 and budget.live == 0
    assert budget.events.count(("start", "w", "g")) == 8
    assert budget.events.count(("finish", "w", "g")) == 8


def test_custom_limit_example_runs() -> None:
    """examples/custom_limit.py stays runnable (it asserts its own outcome)."""
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "custom_limit.py"
    r = subprocess.run([sys.executable, str(example)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "at most 2 jobs ran at once" in r.stdout


def test_bad_limits_are_rejected() -> None:
    import pytest

    from aiojobqueue import ConfigurationError, RateLimit

    for kw in ({"n": 0}, {"n": 1.5}, {"n": True}, {"n": 1, "per": 0}, {"n": 1, "per": float("inf")},
               {"n": 1, "name": ""}):
        with pytest.raises(ConfigurationError):
            RateLimit(**kw)  # type: ignore[arg-type]
    url = "sqlite+aiosqlite:///unused.db"
    with pytest.raises(ConfigurationError):
        JobQueue(url, limits=[RateLimit(5), RateLimit(10, per=60)])  # one ledger, two rules
    with pytest.raises(ConfigurationError):
        JobQueue(url, limits=[object()])  # type: ignore[list-item]
    JobQueue(url, limits=[RateLimit(5), RateLimit(10, per=60, name="hourly")])


class _Flaky(Limit):
    """Raises from available() for its first calls and from every hook."""

    def __init__(self) -> None:
        self.calls = 0

    async def available(self) -> int:
        self.calls += 1
        if self.calls <= 3:
            raise RuntimeError("GPU driver hiccup")
        return 1

    def on_start(self, job_type: str, group: str) -> None:
        raise RuntimeError("bookkeeping bug")

    def on_finish(self, job_type: str, group: str) -> None:
        raise RuntimeError("bookkeeping bug")


async def test_a_failing_limit_fails_closed_and_serving_goes_on(
    make_queue: Callable[..., JobQueue],
) -> None:
    flaky = _Flaky()
    q = make_queue(limits=[flaky])
    async with q:
        @q.handler("w")
        async def w(ctx: Any) -> None: ...

        ids = [await q.enqueue("w", {}) for _ in range(3)]
        await asyncio.wait_for(q.run_until_idle(), timeout=30)
        for i in ids:
            assert (await q.get(i)).state == JobState.DONE
    assert flaky.calls > 3  # nothing started while it raised; it was asked again


async def test_rate_limit_far_from_its_limit_leases_ahead(
    make_queue: Callable[..., JobQueue],
) -> None:
    """A RateLimit counts starts, not slots: far from its limit, a worker with a backlog
    leases ahead as it does uncapped (a claim records more starts than the worker has
    slots), at most a quarter of the starts its last count left; every job runs once and
    the ledger holds every start."""
    from sqlalchemy import func

    from aiojobqueue import RateLimit

    lim = RateLimit(10**6, per=60.0)
    q = make_queue(capacity=2, limits=[lim])
    ran: list[int] = []

    @q.handler("t")
    async def t(ctx: Any) -> None:
        ran.append(ctx.job_id)
        await asyncio.sleep(0.002)

    async with q:
        async with q.batch() as b:
            refs = [b.add("t", {}) for _ in range(300)]
        await q.run_until_idle()
        R = q._t.rate
        async with q.engine.connect() as conn:
            biggest, total = (await conn.execute(
                select(func.max(R.c.starts), func.sum(R.c.starts)))).one()
    assert sorted(ran) == sorted(r.id for r in refs)  # each once
    assert int(total) == 300
    assert biggest > 2  # claims took more than the 2 free slots: leased ahead
    assert lim.headroom == 10**6 - 300

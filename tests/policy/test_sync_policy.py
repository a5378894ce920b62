"""SyncQueue's policy methods on every database: the same rows as JobQueue's, read and
written from code that is not async, and the same typed errors with nothing changed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest
from finalizekit import serving

from aiojobqueue import ConfigurationError, JobContext, JobQueue, RateLimit, SyncQueue
from aiojobqueue.stored_policy import Policy


@pytest.fixture
def sq(db_url: str, prefix: str, queue: JobQueue) -> Iterator[SyncQueue]:
    """A SyncQueue on the ``queue`` fixture's tables."""
    with SyncQueue(db_url, prefix=prefix) as q:
        yield q


async def test_sync_queue_writes_the_policy_a_job_queue_reads(
        sq: SyncQueue, queue: JobQueue) -> None:
    assert sq.policy() == Policy()
    sq.set_policy(concurrency=6, rate=RateLimit(30, per=60.0))
    sq.set_group("tenant-a", weight=3, cap=2, rate=RateLimit(5, per=10.0))
    sq.set_group("*", cap=4)
    sq.pause(group="tenant-b")
    sq.pause(type="fetch")
    sq.pause()
    p = await queue.policy()
    assert p.concurrency == 6 and p.rate is not None and (p.rate.n, p.rate.per) == (30, 60.0)
    a = p.group("tenant-a")
    assert (a.weight, a.cap, a.rate and (a.rate.n, a.rate.per)) == (3, 2, (5, 10.0))
    assert p.group("anyone").cap == 4
    assert p.paused == {("group", "tenant-b"), ("type", "fetch"), ("queue", "")}
    # and back: what JobQueue changes, SyncQueue reads
    await queue.set_policy(concurrency=None)
    sq.resume(group="tenant-b")
    sq.resume(type="fetch")
    sq.resume()
    s = sq.policy()
    assert s.concurrency is None and s.paused == frozenset()
    sq.set_group("tenant-a", weight=None, cap=None)  # an argument left out stays
    assert sq.policy().group("tenant-a").rate is not None


@pytest.mark.parametrize("call", [
    lambda q: q.set_policy(concurrency=0),
    lambda q: q.set_policy(concurrency="8"),
    lambda q: q.set_policy(rate=10),
    lambda q: q.set_group("g", cap=-1),
    lambda q: q.set_group("g", weight=0),
    lambda q: q.set_group("", cap=1),
    lambda q: q.set_group("*", weight=2),
    lambda q: q.pause(group="g", type="t"),
    lambda q: q.pause(group="*"),
    lambda q: q.resume(group="g", type="t"),
], ids=["concurrency0", "concurrency-str", "rate-int", "cap-neg", "weight0", "empty-name",
        "weight-on-star", "pause-both", "pause-star", "resume-both"])
async def test_bad_input_is_a_typed_error_that_changes_nothing(
        sq: SyncQueue, queue: JobQueue, call: object) -> None:
    sq.set_policy(concurrency=3)
    before = await queue.policy()
    with pytest.raises(ConfigurationError) as info:
        call(sq)  # type: ignore[operator]
    assert isinstance(info.value, ValueError) and str(info.value)
    assert await queue.policy() == before


async def test_a_pause_from_sync_code_holds_a_running_worker(
        sq: SyncQueue, make_queue: Callable[..., JobQueue]) -> None:
    """End to end: a SyncQueue pauses a group while a worker serves; the worker starts the
    other group's jobs, not the paused one's (explain says why), until SyncQueue resumes."""
    q = make_queue()

    @q.handler("t")
    async def run(ctx: JobContext) -> None:
        return None

    # SyncQueue's calls block their thread until done: from another thread, as sync code
    # calls them, never from this event loop's (the worker serving on it could be inside a
    # SQLite write transaction that only this loop can finish: the sync write would wait
    # for it until SQLite's busy timeout, "database is locked")
    async with q, serving(q):
        await asyncio.to_thread(sq.pause, group="held")
        # the promise under test: a worker sees a change within poll_interval (0.05 s here)
        await asyncio.sleep(4 * 0.05)
        held = await q.enqueue("t", group="held")
        free = await q.enqueue("t", group="free")
        await q.wait(free, timeout=15)
        assert (await q.get(held)).state == "ready"
        why = await asyncio.to_thread(sq.explain, held)
        assert {"scope": "group", "name": "held"} in [
            r.data for r in why.reasons if r.code == "paused"]
        await asyncio.to_thread(sq.resume, group="held")
        await q.wait(held, timeout=15)

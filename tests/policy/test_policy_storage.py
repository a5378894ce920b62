"""The policy in the database: what set_policy / set_group / pause / resume store, what
policy() reads back, and that bad input raises a typed error and changes nothing."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from aiojobqueue import JobQueue, RateLimit
from aiojobqueue.errors import ConfigurationError
from aiojobqueue.stored_policy import GroupPolicy, Policy


async def test_empty_policy_reads_as_nothing_set(queue: JobQueue) -> None:
    p = await queue.policy()
    assert p == Policy()
    assert p.concurrency is None and p.rate is None and not p.queue_paused
    assert p.group("any") == GroupPolicy()


async def test_set_policy_stores_and_none_clears_one(queue: JobQueue) -> None:
    await queue.set_policy(concurrency=8, rate=RateLimit(100, per=60.0))
    p = await queue.policy()
    assert p.concurrency == 8
    assert p.rate is not None and (p.rate.n, p.rate.per) == (100, 60.0)
    await queue.set_policy(rate=None)  # concurrency not given: left as it is
    p = await queue.policy()
    assert p.concurrency == 8 and p.rate is None
    await queue.set_policy(concurrency=None)
    assert await queue.policy() == Policy()


async def test_set_group_and_the_default_row(queue: JobQueue) -> None:
    await queue.set_group("tenant-a", weight=3, cap=2, rate=RateLimit(10, per=60.0))
    await queue.set_group("*", cap=5, rate=RateLimit(7, per=1.0))
    await queue.set_group("tenant-b", weight=2)
    p = await queue.policy()
    a, b, other = p.group("tenant-a"), p.group("tenant-b"), p.group("nobody")
    assert (a.weight, a.cap, a.rate and a.rate.n) == (3, 2, 10)
    # tenant-b has a row for its weight only: its cap and rate are the "*" row's
    assert (b.weight, b.cap, b.rate and b.rate.n) == (2, 5, 7)
    assert (other.weight, other.cap, other.rate and other.rate.n) == (None, 5, 7)
    assert set(p.groups) == {"tenant-a", "tenant-b"} and p.default.cap == 5
    await queue.set_group("tenant-b", weight=None)  # a row left empty is deleted
    assert set((await queue.policy()).groups) == {"tenant-a"}


async def test_pause_and_resume_group_type_and_queue(queue: JobQueue) -> None:
    await queue.pause(group="g1")
    await queue.pause(type="fetch")
    await queue.pause()
    p = await queue.policy()
    assert p.paused == frozenset({("group", "g1"), ("type", "fetch"), ("queue", "")})
    assert p.queue_paused and p.group("g1").paused and not p.group("g2").paused
    await queue.resume(group="g1")
    await queue.resume(type="fetch")
    await queue.resume()
    await queue.resume(group="never-paused")  # nothing to do: no error, no row
    assert await queue.policy() == Policy()


@pytest.mark.parametrize("call", [
    lambda q: q.set_policy(concurrency=0),
    lambda q: q.set_policy(concurrency=-1),
    lambda q: q.set_policy(concurrency="3"),
    lambda q: q.set_policy(rate=5),
    lambda q: q.set_group("g", cap=-1),
    lambda q: q.set_group("g", weight=0),
    lambda q: q.set_group("g", weight=True),
    lambda q: q.set_group("", cap=1),
    lambda q: q.set_group("x" * 201, cap=1),
    lambda q: q.set_group("*", weight=2),
    lambda q: q.pause(group="g", type="t"),
    lambda q: q.pause(group="*"),
    lambda q: q.resume(type=""),
])
async def test_bad_input_is_a_typed_error_that_changes_nothing(
    make_queue: Callable[..., JobQueue], call: Callable[[JobQueue], object],
) -> None:
    q = make_queue()
    async with q:
        await q.set_group("g", cap=1)
        before = await q.policy()
        with pytest.raises(ConfigurationError):
            await call(q)  # type: ignore[misc]
        assert await q.policy() == before


async def test_unknown_keyword_is_refused(queue: JobQueue) -> None:
    with pytest.raises(TypeError):
        await queue.set_group("g", caps=2)  # type: ignore[call-arg]
    assert await queue.policy() == Policy()

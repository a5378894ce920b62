"""Plain ``def`` handlers (threads.py): they run in worker threads, at most ``capacity`` at
once, with a synchronous ``ctx`` whose calls run on the worker's loop; at a timeout the
attempt fails and the thread keeps its slot until it returns."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from aiojobqueue import JobQueue, JobState
from aiojobqueue.threads import ThreadContext


async def test_plain_handler_runs_in_a_thread_with_a_working_ctx(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue()
    loop_thread = threading.get_ident()
    seen: dict[str, Any] = {}

    @q.handler("leaf")
    def leaf(ctx: ThreadContext, n: int) -> int:
        return n * 10

    @q.handler("work")
    def work(ctx: ThreadContext, n: int) -> dict[str, Any]:
        seen["thread"] = threading.get_ident()
        seen["checkpointed"] = ctx.checkpointed
        ctx.progress(1, 3, "started")
        ctx.checkpoint({"step": 1})
        one = ctx.enqueue("leaf", {"n": n})
        with ctx.batch() as b:
            r = b.add("leaf", {"n": n + 1})
            b.add("sum", {}, depends_on=[r, one])
        return {"job": ctx.job_id, "attempt": ctx.attempt, "group": ctx.group, "one": one}

    @q.handler("sum")
    def total(ctx: ThreadContext) -> int:
        return sum(ctx.dependency_results().values())

    async with q:
        jid = await q.enqueue("work", {"n": 4}, group="acme")
        await q.run_until_idle()
        job = await q.get(jid)
        assert job.state == JobState.DONE, job.error
        assert job.result == {"job": jid, "attempt": 1, "group": "acme", "one": jid + 1}
        assert job.progress is not None and job.progress["message"] == "started"
        assert seen["thread"] != loop_thread and seen["checkpointed"] is None
        sums = [j for j in [await q.get(i) for i in range(jid, jid + 4)] if j.type == "sum"]
        assert len(sums) == 1 and sums[0].result == 40 + 50


async def test_a_plain_handlers_exception_fails_the_attempt_with_its_traceback(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue(max_attempts=2)

    @q.handler("boom")
    def boom(ctx: ThreadContext) -> None:
        raise ValueError(f"bad attempt {ctx.attempt}")

    async with q:
        jid = await q.enqueue("boom")
        await q.run_until_idle()
        job = await q.get(jid)
        assert job.state == JobState.FAILED and job.attempts == 2
        assert job.error is not None and job.error["type"] == "ValueError"
        assert "bad attempt 2" in job.error["message"] and "raise ValueError" in (
            job.error["traceback"])


async def test_plain_threads_are_bounded_by_capacity(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue(capacity=3)
    lock = threading.Lock()
    now = [0]
    most = [0]

    @q.handler("nap")
    def nap(ctx: ThreadContext) -> None:
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.15)
        with lock:
            now[0] -= 1

    async with q:
        for _ in range(10):
            await q.enqueue("nap")
        await q.run_until_idle()
    assert most[0] == 3


async def test_a_timed_out_threads_slot_stays_taken_until_it_returns(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue(capacity=1, max_attempts=1)
    log: list[tuple[str, int, float]] = []

    @q.handler("slow")
    def slow(ctx: ThreadContext, seconds: float) -> None:
        log.append(("start", ctx.job_id, time.time()))
        time.sleep(seconds)
        log.append(("end", ctx.job_id, time.time()))

    async with q:
        a = await q.enqueue("slow", {"seconds": 1.5}, timeout=0.3)
        b = await q.enqueue("slow", {"seconds": 0.0})
        await q.run_until_idle()
        ja, jb = await q.get(a), await q.get(b)
    assert ja.state == JobState.FAILED and ja.error is not None
    assert ja.error["type"] == "TimeoutError"
    assert jb.state == JobState.DONE
    at = {(ev, jid): t for ev, jid, t in log}
    # b was not even claimed until a's thread had returned (capacity 1: the slot stayed
    # taken), well after the timeout failed a's attempt
    assert jb.started_at is not None
    assert jb.started_at.timestamp() >= at[("end", a)] - 0.05, (jb.started_at, at)
    assert at[("start", b)] >= at[("end", a)]
    assert at[("end", a)] - at[("start", a)] >= 1.4

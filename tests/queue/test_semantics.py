"""DAG semantics on every database: failure propagation, retry, cancel, containers,
dynamic DAGs, context helpers, wait/get, priority, and handler-type filtering."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from aiojobqueue import (
    InvalidStateError,
    JobCancelled,
    JobContext,
    JobFailed,
    JobNotFoundError,
    JobQueue,
    JobState,
)

D, F, C = JobState.DONE, JobState.FAILED, JobState.CANCELLED


async def states(q: JobQueue, *ids: int) -> list[JobState]:
    return [(await q.get(i)).state for i in ids]


class Recorder:
    """Handlers that log start/end (monotonic) per job name, and fail on demand."""

    def __init__(self, q: JobQueue, max_attempts: int = 1) -> None:
        self.starts: dict[str, float] = {}
        self.ends: dict[str, float] = {}
        self.order: list[str] = []
        self.attempts: dict[str, list[int]] = {}
        self.fail: set[str] = set()

        @q.handler("step", max_attempts=max_attempts)
        async def step(ctx: JobContext, name: str, sleep: float = 0.0) -> str:
            self.starts[name] = time.monotonic()
            self.order.append(name)
            self.attempts.setdefault(name, []).append(ctx.attempt)
            if sleep:
                await asyncio.sleep(sleep)
            self.ends[name] = time.monotonic()
            if name in self.fail:
                raise RuntimeError(f"{name} broke")
            return name


def step(name: str, **kw: Any) -> tuple[str, dict[str, Any]]:
    return "step", {"name": name, **kw}


# -- failure, retry, cancel -----------------------------------------------------------------


async def test_failure_cancels_dependents_transitively_and_rolls_up(queue: JobQueue) -> None:
    rec = Recorder(queue)
    rec.fail.add("a")
    async with queue.batch() as b:
        a = b.add(*step("a"))
        x = b.add(*step("x"), depends_on=[a])
        y = b.add(*step("y"), depends_on=[x])
        box = b.container("box")
        inbox = b.add(*step("in"), parent=box, depends_on=[a])
        ok = b.add(*step("ok"), parent=box)
        after_box = b.add(*step("after"), depends_on=[box])
        fbox = b.container("fbox")  # a container whose child fails for good
        b.add(*step("a2"), parent=fbox)
        independent = b.add(*step("free"))
    rec.fail.add("a2")
    await queue.run_until_idle()
    assert await states(queue, a.id, x.id, y.id, inbox.id, ok.id) == [F, C, C, C, D]
    assert await states(queue, box.id, after_box.id, fbox.id, independent.id) == [C, C, F, D]
    for j in (x, y, inbox):
        job = await queue.get(j.id)
        assert job.error is not None and job.error["message"] == f"upstream {a.id} failed"
        assert job.cancelled_by == a.id and job.attempts == 0
    assert "x" not in rec.order and "y" not in rec.order and "after" not in rec.order
    err = (await queue.get(a.id)).error
    assert err is not None and err["type"] == "RuntimeError" and err["message"] == "a broke"
    assert "Traceback" in err["traceback"]
    with pytest.raises(JobFailed) as ei:
        await queue.wait(a.id, timeout=5)
    assert ei.value.error["message"] == "a broke"
    with pytest.raises(JobCancelled):
        await queue.wait(y.id, timeout=5)


async def test_retry_revives_the_job_and_what_it_cancelled(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue()
    rec = Recorder(q, max_attempts=2)
    async with q:
        rec.fail.add("a")
        async with q.batch() as b:
            a = b.add(*step("a"))
            x = b.add(*step("x"), depends_on=[a])
            box = b.container("box")
            inbox = b.add(*step("in"), parent=box, depends_on=[x])
            after = b.add(*step("after"), depends_on=[box])
        await q.run_until_idle()
        assert await states(q, a.id, x.id, inbox.id, box.id, after.id) == [F, C, C, C, C]
        assert rec.attempts["a"] == [1, 2]
        rec.fail.discard("a")
        await q.retry(a.id)
        assert (await q.get(a.id)).state in (JobState.READY, JobState.SCHEDULED)
        assert (await q.get(x.id)).state == JobState.WAITING
        await q.run_until_idle()
        assert await states(q, a.id, x.id, inbox.id, box.id, after.id) == [D, D, D, D, D]
        assert rec.attempts["a"] == [1, 2, 3]  # attempt numbers keep counting
        assert (await q.get(a.id)).attempts == 3 and (await q.get(a.id)).error is None
        assert await q.wait(after.id, timeout=5) == "after"


async def test_retry_grants_one_more_round_of_max_attempts(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue()
    rec = Recorder(q, max_attempts=2)
    async with q:
        rec.fail.add("a")
        a = await q.enqueue(*step("a"))
        await q.run_until_idle()
        assert rec.attempts["a"] == [1, 2]
        await q.retry(a)
        await q.run_until_idle()
        assert rec.attempts["a"] == [1, 2, 3, 4]
        job = await q.get(a)
        assert job.state == F and job.attempts == 4


async def test_retry_of_a_live_or_done_job_is_refused(queue: JobQueue) -> None:
    rec = Recorder(queue)
    a = await queue.enqueue(*step("a"))
    with pytest.raises(InvalidStateError):
        await queue.retry(a)
    await queue.run_until_idle()
    with pytest.raises(InvalidStateError):
        await queue.retry(a)
    with pytest.raises(JobNotFoundError):
        await queue.retry(10**9)
    assert rec.order == ["a"]


async def test_retry_of_a_cancelled_dependent_alone(queue: JobQueue) -> None:
    """Retrying a job that was cancelled by an upstream failure leaves it waiting on the
    (still failed) upstream only after that upstream is retried too."""
    rec = Recorder(queue)
    rec.fail.add("a")
    async with queue.batch() as b:
        a = b.add(*step("a"))
        x = b.add(*step("x"), depends_on=[a])
    await queue.run_until_idle()
    assert await states(queue, a.id, x.id) == [F, C]
    rec.fail.discard("a")
    await queue.retry(a.id)
    await queue.run_until_idle()
    assert await states(queue, a.id, x.id) == [D, D]


async def test_retry_leaves_a_job_with_another_dead_upstream_cancelled(queue: JobQueue) -> None:
    """x needs a and b; both fail. Retrying a alone must not leave x waiting for ever on
    the still-failed b: x (and what follows it) stays cancelled, now naming b."""
    rec = Recorder(queue)
    rec.fail |= {"a", "b"}
    async with queue.batch() as b:
        a = b.add(*step("a"))
        bb = b.add(*step("b"))
        x = b.add(*step("x"), depends_on=[a, bb])
        box = b.container("box")
        y = b.add(*step("y"), depends_on=[x], parent=box)
    await queue.run_until_idle()
    assert await states(queue, a.id, bb.id, x.id, y.id, box.id) == [F, F, C, C, C]
    rec.fail.clear()
    cause = (await queue.get(x.id)).cancelled_by
    first, second = (a.id, bb.id) if cause == a.id else (bb.id, a.id)
    await queue.retry(first)
    await queue.run_until_idle()
    assert await states(queue, first, second, x.id, y.id, box.id) == [D, F, C, C, C]
    assert (await queue.get(x.id)).cancelled_by == second
    await queue.retry(second)
    await queue.run_until_idle()
    assert await states(queue, a.id, bb.id, x.id, y.id, box.id) == [D, D, D, D, D]
    assert rec.order.count("x") == 1 and rec.order.count("y") == 1


async def test_failure_rolls_up_through_nested_containers(queue: JobQueue) -> None:
    rec = Recorder(queue)
    rec.fail.add("bad")
    async with queue.batch() as b:
        outer = b.container("outer")
        inner = b.container("inner", parent=outer)
        bad = b.add(*step("bad"), parent=inner)
        sib = b.add(*step("sib"), parent=inner, depends_on=[bad])
        fine = b.add(*step("fine"), parent=outer)
        after = b.add(*step("after"), depends_on=[outer])
    await queue.run_until_idle()
    assert await states(queue, bad.id, sib.id, inner.id, fine.id, outer.id, after.id) == [
        F, C, F, D, F, C]
    assert (await queue.get(after.id)).error == {
        "type": "UpstreamFailed", "message": f"upstream {outer.id} failed"}


async def test_retry_of_a_container_retries_what_made_it_fail(queue: JobQueue) -> None:
    rec = Recorder(queue)
    rec.fail.add("c1")
    async with queue.batch() as b:
        box = b.container("box")
        c1 = b.add(*step("c1"), parent=box)
        c2 = b.add(*step("c2"), parent=box)
        after = b.add(*step("after"), depends_on=[box])
    await queue.run_until_idle()
    assert await states(queue, c1.id, c2.id, box.id, after.id) == [F, D, F, C]
    rec.fail.clear()
    await queue.retry(box.id)
    await queue.run_until_idle()
    assert await states(queue, c1.id, c2.id, box.id, after.id) == [D, D, D, D]
    assert rec.order.count("c2") == 1  # a done child is not run again


async def test_retry_of_one_child_does_not_revive_its_failed_siblings(queue: JobQueue) -> None:
    rec = Recorder(queue)
    rec.fail |= {"c1", "c2"}
    async with queue.batch() as b:
        box = b.container("box")
        c1 = b.add(*step("c1"), parent=box)
        c2 = b.add(*step("c2"), parent=box)
        after = b.add(*step("after"), depends_on=[box])
    await queue.run_until_idle()
    assert await states(queue, c1.id, c2.id, box.id, after.id) == [F, F, F, C]
    rec.fail.clear()
    await queue.retry(c1.id)  # the box reopens with c1, but c2 stays failed ...
    await queue.run_until_idle()
    assert await states(queue, c1.id, c2.id, box.id, after.id) == [D, F, F, C]
    await queue.retry(c2.id)  # ... until it is retried too
    await queue.run_until_idle()
    assert await states(queue, c1.id, c2.id, box.id, after.id) == [D, D, D, D]
    assert rec.order.count("after") == 1


async def test_cancel_waiting_and_ready_jobs_propagates(queue: JobQueue) -> None:
    rec = Recorder(queue)
    async with queue.batch() as b:
        a = b.add(*step("a"))
        x = b.add(*step("x"), depends_on=[a])
        box = b.container("box")
        c1 = b.add(*step("c1"), parent=box)
        sub = b.container("sub", parent=box)
        c2 = b.add(*step("c2"), parent=sub, depends_on=[c1])
        after = b.add(*step("after"), depends_on=[box])
        other = b.add(*step("other"))
    await queue.cancel(a.id)  # ready
    assert await states(queue, a.id, x.id) == [C, C]
    assert (await queue.get(x.id)).error == {"type": "UpstreamFailed",
                                             "message": f"upstream {a.id} cancelled"}
    await queue.cancel(box.id)  # a container: its children and its dependents
    assert await states(queue, box.id, c1.id, sub.id, c2.id, after.id) == [C, C, C, C, C]
    await queue.cancel(box.id)  # terminal: no-op
    with pytest.raises(JobNotFoundError):
        await queue.cancel(10**9)
    await queue.run_until_idle()
    assert rec.order == ["other"]
    assert (await queue.get(other.id)).state == D
    with pytest.raises(JobCancelled):
        await queue.wait(c2.id, timeout=5)


async def test_cancel_a_waiting_job_leaves_its_upstream_alone(queue: JobQueue) -> None:
    rec = Recorder(queue)
    async with queue.batch() as b:
        a = b.add(*step("a"))
        x = b.add(*step("x"), depends_on=[a])
        y = b.add(*step("y"), depends_on=[x])
    await queue.cancel(x.id)
    await queue.run_until_idle()
    assert await states(queue, a.id, x.id, y.id) == [D, C, C]
    assert rec.order == ["a"]


# -- containers -----------------------------------------------------------------------------


async def test_empty_container_is_done_at_once(queue: JobQueue) -> None:
    rec = Recorder(queue)
    async with queue.batch() as b:
        empty = b.container("empty")
        after = b.add(*step("after"), depends_on=[empty])
        gate = b.add(*step("gate"))
        later = b.container("later", depends_on=[gate])  # empty, but must wait for gate
        tail = b.add(*step("tail"), depends_on=[later])
    assert (await queue.get(empty.id)).state == D
    assert (await queue.get(after.id)).state == JobState.READY
    assert (await queue.get(later.id)).state == JobState.WAITING
    await queue.run_until_idle()
    assert await states(queue, later.id, tail.id) == [D, D]
    assert rec.order.index("tail") > rec.order.index("gate")


async def test_nested_containers_and_container_dependencies(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue(capacity=8)
    rec = Recorder(q)
    async with q:
        async with q.batch() as b:
            first = b.add(*step("first", sleep=0.05))
            outer = b.container("outer", depends_on=[first])
            inner = b.container("inner", parent=outer)
            x = b.add(*step("x", sleep=0.05), parent=inner)
            b.add(*step("y", sleep=0.02), parent=inner, depends_on=[x])
            deep = b.container("deep", parent=inner)
            b.add(*step("z", sleep=0.1), parent=deep)
            b.add(*step("w"), parent=outer)
            after = b.add(*step("after"), depends_on=[outer])
            after_inner = b.add(*step("after_inner"), depends_on=[inner])
        assert (await q.get(outer.id)).state == JobState.WAITING
        assert (await q.get(x.id)).state == JobState.WAITING  # its container waits on first
        await q.run_until_idle()
        assert (await q.get(after.id)).state == D and (await q.get(after_inner.id)).state == D
    s, e = rec.starts, rec.ends
    # children (at any depth) wait for their containers' dependencies
    for name in ("x", "y", "z", "w"):
        assert s[name] >= e["first"], name
    # depending on a container waits for the whole container, nested ones included
    assert s["after"] >= max(e[n] for n in ("x", "y", "z", "w"))
    assert s["after_inner"] >= max(e[n] for n in ("x", "y", "z"))
    assert s["y"] >= e["x"]


# -- running handlers -----------------------------------------------------------------------


async def test_handlers_extend_the_dag_at_run_time(queue: JobQueue) -> None:
    seen: list[str] = []

    @queue.handler("spawn")
    async def spawn(ctx: JobContext, n: int) -> int:
        async with ctx.batch() as b:
            parts = [b.add("part", {"i": i}) for i in range(n)]
            b.add("merge", {}, depends_on=parts)
        await ctx.enqueue("part", {"i": 100})
        return n

    @queue.handler("part")
    async def part(ctx: JobContext, i: int) -> int:
        seen.append(f"part{i}")
        return i * i

    @queue.handler("merge")
    async def merge(ctx: JobContext) -> int:
        results = await ctx.dependency_results()
        seen.append("merge")
        return sum(results.values())

    await queue.enqueue("spawn", {"n": 5})
    await queue.run_until_idle()
    parts = sorted(s for s in seen if s != "merge")
    assert parts == sorted(f"part{i}" for i in [0, 1, 2, 3, 4, 100])
    assert seen.count("merge") == 1 and seen.index("merge") > max(
        seen.index(f"part{i}") for i in range(5))
    J = queue._t.jobs
    from sqlalchemy import select

    async def merged(conn: Any) -> Any:
        return (await conn.execute(select(J.c.result).where(J.c.type == "merge"))).scalar_one()

    assert await queue._read(merged) == sum(i * i for i in range(5))


async def test_handler_grows_its_own_container(queue: JobQueue) -> None:
    """A running child adds a sibling to its container and a job that waits for itself:
    the container (and what depends on it) waits for the newcomers."""
    times: dict[str, float] = {}

    @queue.handler("grow")
    async def grow(ctx: JobContext) -> None:
        assert ctx.parent_id is not None
        await ctx.enqueue("leaf", {"name": "sibling"}, parent=ctx.parent_id)
        await ctx.enqueue("leaf", {"name": "follower"}, depends_on=[ctx.job_id],
                          parent=ctx.parent_id)
        times["grow"] = time.monotonic()

    @queue.handler("leaf")
    async def leaf(ctx: JobContext, name: str) -> None:
        times[name + ".start"] = time.monotonic()
        await asyncio.sleep(0.05)
        times[name] = time.monotonic()

    async with queue.batch() as b:
        box = b.container("box")
        b.add("grow", parent=box)
        b.add("leaf", {"name": "after"}, depends_on=[box])
    await queue.run_until_idle()
    assert (await queue.get(box.id)).state == D
    assert times["after.start"] >= max(times["sibling"], times["follower"])
    assert times["follower.start"] >= times["grow"]


async def test_dependency_results_maps_ids_to_results(queue: JobQueue) -> None:
    got: dict[int, Any] = {}

    @queue.handler("src")
    async def src(ctx: JobContext, v: Any) -> Any:
        return v

    @queue.handler("sink")
    async def sink(ctx: JobContext) -> None:
        got.update(await ctx.dependency_results())

    async with queue.batch() as b:
        a1 = b.add("src", {"v": {"k": [1, 2]}})
        a2 = b.add("src", {"v": None})
        a3 = b.add("src", {"v": "text"})
        b.add("sink", depends_on=[a1, a2, a3])
    await queue.run_until_idle()
    assert got == {a1.id: {"k": [1, 2]}, a2.id: None, a3.id: "text"}


async def test_checkpoint_survives_a_failed_attempt(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()
    seen: list[Any] = []

    @q.handler("cp", max_attempts=3)
    async def cp(ctx: JobContext) -> Any:
        seen.append((ctx.attempt, ctx.checkpointed))
        if ctx.attempt == 1:
            await ctx.checkpoint({"step": 1})
            assert ctx.checkpointed == {"step": 1}
            raise RuntimeError("crash after step 1")
        if ctx.attempt == 2:
            await ctx.checkpoint({"step": 2, "prev": ctx.checkpointed})
            raise TimeoutError("hung")  # a builtin TimeoutError from the handler
        return ctx.checkpointed

    async with q:
        jid = await q.enqueue("cp")
        await q.run_until_idle()
        assert await q.wait(jid, timeout=5) == {"step": 2, "prev": {"step": 1}}
    assert seen == [(1, None), (2, {"step": 1}), (3, {"step": 2, "prev": {"step": 1}})]


async def test_wait_result_failure_cancel_and_timeout(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()

    @q.handler("ok")
    async def ok(ctx: JobContext) -> dict[str, int]:
        return {"v": 1}

    @q.handler("bad", max_attempts=1)
    async def bad(ctx: JobContext) -> None:
        raise KeyError("nope")

    async with q:
        good = await q.enqueue("ok")
        failing = await q.enqueue("bad")
        dependent = await q.enqueue("ok", depends_on=[failing])
        never = await q.enqueue("nobody-handles-this")
        server = asyncio.create_task(q.serve())
        try:
            assert await q.wait(good, timeout=10) == {"v": 1}
            with pytest.raises(JobFailed) as ei:
                await q.wait(failing, timeout=10)
            assert ei.value.job_id == failing and ei.value.error["type"] == "KeyError"
            with pytest.raises(JobCancelled) as ec:
                await q.wait(dependent, timeout=10)
            assert str(failing) in ec.value.error["message"]
            t0 = time.monotonic()
            with pytest.raises(TimeoutError):
                await q.wait(never, timeout=0.3)
            assert 0.25 <= time.monotonic() - t0 < 3.0
        finally:
            server.cancel()
            await asyncio.gather(server, return_exceptions=True)
        with pytest.raises(JobNotFoundError):
            await q.wait(10**9, timeout=1)


async def test_get_of_unknown_id_raises_lookup_error(queue: JobQueue) -> None:
    with pytest.raises(JobNotFoundError) as ei:
        await queue.get(123456789)
    assert isinstance(ei.value, LookupError)
    with pytest.raises(LookupError):
        await queue.get(0)
    # ids no database could hold, or that are not ids at all: typed, never a driver error
    for bad in ("abc", 2**70, -1, 1.5, None, True):
        for op in (queue.get, queue.cancel, queue.retry):
            with pytest.raises(JobNotFoundError):
                await op(bad)  # type: ignore[arg-type]


async def test_priority_then_age_within_a_group(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue(capacity=1)
    rec = Recorder(q)
    async with q:
        plan = [("a", 0), ("b", 5), ("c", 1), ("d", 5), ("e", -3), ("f", 1)]
        for name, prio in plan:
            await q.enqueue(*step(name), priority=prio)
        await q.run_until_idle()
    assert rec.order == ["b", "d", "c", "f", "a", "e"]


async def test_worker_claims_only_types_it_handles(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()
    rec = Recorder(q)
    async with q:
        stranger = await q.enqueue("no-handler-here", {"x": 1})
        names = [await q.enqueue(*step(f"s{i}")) for i in range(5)]
        await q.run_until_idle()
        job = await q.get(stranger)
        assert job.state == JobState.READY and job.attempts == 0 and job.lease_owner is None
        assert await states(q, *names) == [D] * 5
    assert sorted(rec.order) == [f"s{i}" for i in range(5)]

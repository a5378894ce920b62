"""Run conditions (when="done" | "failed" | "finished") on every database: what runs,
what ends cancelled and why, with containers, external steps and retry()."""

from __future__ import annotations

from typing import Any

import pytest

from aiojobqueue import InvalidJobError, JobContext, JobQueue, JobState

D, F, C = JobState.DONE, JobState.FAILED, JobState.CANCELLED


def handlers(q: JobQueue) -> list[str]:
    ran: list[str] = []

    @q.handler("ok")
    async def ok(ctx: JobContext, name: str) -> str:
        ran.append(name)
        return name

    @q.handler("bad", max_attempts=1)
    async def bad(ctx: JobContext, name: str) -> None:
        ran.append(name)
        raise RuntimeError(f"{name} broke")

    @q.handler("see")
    async def see(ctx: JobContext, name: str) -> Any:
        ran.append(name)
        return {str(k): v for k, v in (await ctx.dependency_results()).items()}

    return ran


async def states(q: JobQueue, *ids: int) -> list[JobState]:
    return [(await q.get(i)).state for i in ids]


async def test_failed_and_finished_run_after_a_failure(queue: JobQueue) -> None:
    ran = handlers(queue)
    async with queue.batch() as b:
        a = b.add("ok", {"name": "a"})
        x = b.add("bad", {"name": "x"}, depends_on=[a])
        y = b.add("ok", {"name": "y"})
        plain = b.add("ok", {"name": "plain"}, depends_on=[x, y])
        cleanup = b.add("see", {"name": "cleanup"}, depends_on=[x, y], when="failed")
        always = b.add("see", {"name": "always"}, depends_on=[x, y], when="finished")
        after = b.add("ok", {"name": "after"}, depends_on=[cleanup])
    await queue.run_until_idle()
    assert await states(queue, a.id, x.id, y.id, plain.id, cleanup.id, always.id, after.id) == [
        D, F, D, C, D, D, D]
    assert sorted(ran) == ["a", "after", "always", "cleanup", "x", "y"]
    # it ran after every dependency was terminal, and reads their results
    assert (await queue.get(cleanup.id)).result == {str(x.id): None, str(y.id): "y"}


async def test_failed_is_cancelled_with_a_reason_when_everything_succeeded(
    queue: JobQueue,
) -> None:
    ran = handlers(queue)
    async with queue.batch() as b:
        box = b.container("box")
        a = b.add("ok", {"name": "a"}, parent=box)
        cleanup = b.add("ok", {"name": "cleanup"}, depends_on=[a], when="failed", parent=box)
        always = b.add("ok", {"name": "always"}, depends_on=[a], when="finished")
        next_ = b.add("ok", {"name": "next"}, depends_on=[box])
    await queue.run_until_idle()
    job = await queue.get(cleanup.id)
    assert job.state == C and job.error is not None
    assert job.error["type"] == "ConditionNotMet" and "every dependency ended done" in (
        job.error["message"])
    # a condition that did not hold does not make its container cancelled
    assert await states(queue, box.id, always.id, next_.id) == [D, D, D]
    assert "cleanup" not in ran
    # retried (outside a container): every dependency is still done, so it cannot hold
    gate = await queue.enqueue_external()
    lone = await queue.enqueue("ok", {"name": "lone"}, depends_on=[gate], when="failed")
    await queue.complete(gate)
    assert (await queue.get(lone)).state == C
    await queue.retry(lone)
    job = await queue.get(lone)
    assert job.state == C and job.error is not None and job.error["type"] == "ConditionNotMet"


async def test_conditions_over_a_failed_container_and_an_external_step(
    queue: JobQueue,
) -> None:
    handlers(queue)
    async with queue.batch() as b:
        box = b.container("box")
        b.add("bad", {"name": "x"}, parent=box)
        step = b.external("approval")
        alert = b.add("ok", {"name": "alert"}, depends_on=[box, step], when="failed")
        report = b.add("ok", {"name": "report"}, depends_on=[step], when="finished")
    await queue.run_until_idle()
    assert await states(queue, box.id, alert.id, report.id) == [F, JobState.WAITING,
                                                                 JobState.WAITING]
    await queue.fail(step.id, "refused")
    await queue.run_until_idle()
    assert await states(queue, alert.id, report.id) == [D, D]


async def test_a_cancelled_upstream_counts_as_not_done(queue: JobQueue) -> None:
    handlers(queue)
    gate = await queue.enqueue_external()
    mid = await queue.enqueue("ok", {"name": "mid"}, depends_on=[gate])
    cleanup = await queue.enqueue("ok", {"name": "c"}, depends_on=[mid], when="failed")
    await queue.cancel(gate)  # mid is cancelled by it, cleanup then runs
    await queue.run_until_idle()
    assert await states(queue, mid, cleanup) == [C, D]


async def test_inserted_under_an_already_failed_upstream(queue: JobQueue) -> None:
    handlers(queue)
    x = await queue.enqueue("bad", {"name": "x"})
    await queue.run_until_idle()
    ok = await queue.enqueue("ok", {"name": "ok"})
    late = await queue.enqueue("ok", {"name": "late"}, depends_on=[x, ok], when="failed")
    plain = await queue.enqueue("ok", {"name": "p"}, depends_on=[x])
    assert await states(queue, late, plain) == [JobState.WAITING, C]
    await queue.run_until_idle()
    assert (await queue.get(late)).state == D
    with pytest.raises(InvalidJobError, match="could never run"):
        await queue.enqueue("ok", {"name": "n"}, depends_on=[ok], when="failed")
    with pytest.raises(InvalidJobError, match="could never run"):
        await queue.enqueue("ok", {"name": "n"}, when="failed")
    with pytest.raises(InvalidJobError, match="when must be"):
        await queue.enqueue("ok", {"name": "n"}, when="always")


async def test_retry_of_the_failed_upstream(queue: JobQueue) -> None:
    """The cancelled downstream come back; a when="failed" job that already ran stays
    done (it is not revived: retry it yourself to run it again)."""
    ran = handlers(queue)
    flaky = {"fail": True}

    @queue.handler("flaky", max_attempts=1)
    async def flaky_(ctx: JobContext) -> str:
        if flaky["fail"]:
            raise RuntimeError("down")
        return "up"

    x = await queue.enqueue("flaky")
    plain = await queue.enqueue("ok", {"name": "plain"}, depends_on=[x])
    cleanup = await queue.enqueue("ok", {"name": "cleanup"}, depends_on=[x], when="failed")
    await queue.run_until_idle()
    assert await states(queue, x, plain, cleanup) == [F, C, D]
    flaky["fail"] = False
    await queue.retry(x)
    await queue.run_until_idle()
    assert await states(queue, x, plain, cleanup) == [D, D, D]
    assert ran.count("cleanup") == 1


async def test_explain_says_why_a_when_failed_job_waits(queue: JobQueue) -> None:
    a = await queue.enqueue_external()
    b = await queue.enqueue_external()
    cleanup = await queue.enqueue("ok", {"name": "c"}, depends_on=[a, b], when="failed")
    e = await queue.explain(cleanup)
    assert e.codes == ["waiting_on", "condition"]
    assert "none has yet" in str(e) and e.reasons[1].data["failed_upstream"] is False
    await queue.fail(a, "no")
    e = await queue.explain(cleanup)
    assert e.reasons[0].data["ids"] == [b] and e.reasons[1].data["failed_upstream"] is True

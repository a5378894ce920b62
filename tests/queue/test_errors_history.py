"""``Job.errors`` on every database: each failed attempt, oldest first, kept on success,
bounded, written by the failure finalize and by the reclaim of an expired lease, and never
by the success path."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import event, update

from aiojobqueue import JobContext, JobQueue
from aiojobqueue.history import KEEP


async def test_failed_attempts_are_kept_when_the_job_succeeds(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue()

    @q.handler("flaky", max_attempts=3)
    async def flaky(ctx: JobContext) -> str:
        if ctx.attempt == 1:
            raise ValueError("first try")
        if ctx.attempt == 2:
            raise KeyError("second try")
        return "ok"

    async with q:
        before = datetime.now(UTC) - timedelta(seconds=5)
        jid = await q.enqueue("flaky")
        await q.run_until_idle()
        job = await q.get(jid)
    assert job.state == "done" and job.result == "ok" and job.error is None
    assert [(e["attempt"], e["type"]) for e in job.errors] == [(1, "ValueError"), (2, "KeyError")]
    assert job.errors[0]["message"] == "first try"
    assert "raise ValueError" in job.errors[0]["traceback"]
    assert {e["worker"] for e in job.errors} == {q.worker_id}
    assert before < job.errors[0]["at"] <= job.errors[1]["at"] <= datetime.now(UTC)
    assert job.errors_omitted == 0


async def test_the_last_error_is_the_last_of_the_history(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue()

    @q.handler("bad", max_attempts=2)
    async def bad(ctx: JobContext) -> None:
        raise RuntimeError(f"boom {ctx.attempt}")

    async with q:
        jid = await q.enqueue("bad")
        await q.run_until_idle()
        job = await q.get(jid)
        assert job.state == "failed"
        assert [e["message"] for e in job.errors] == ["boom 1", "boom 2"]
        assert job.error is not None and job.error["message"] == job.errors[-1]["message"]
        # a manual retry keeps the history and adds to it
        await q.retry(jid)
        await q.run_until_idle()
        job = await q.get(jid)
    assert [e["attempt"] for e in job.errors] == [1, 2, 3, 4]


async def test_history_is_bounded_with_a_count_of_older_attempts(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue(retry_backoff=0.001, retry_backoff_max=0.002)
    n = KEEP + 5

    @q.handler("bad", max_attempts=n)
    async def bad(ctx: JobContext) -> None:
        raise RuntimeError(f"boom {ctx.attempt}")

    async with q:
        jid = await q.enqueue("bad")
        await q.run_until_idle()
        job = await q.get(jid)
    assert job.state == "failed" and job.attempts == n
    assert [e["attempt"] for e in job.errors] == list(range(6, n + 1))
    assert job.errors_omitted == 5


async def test_a_reclaimed_attempt_joins_the_history(
    make_queue: Callable[..., JobQueue],
) -> None:
    """The worker that ran attempt 1 died (its row: leased to it, the lease expired); the
    reclaimer counts the attempt and records it, naming the dead worker."""
    q = make_queue()

    @q.handler("t", max_attempts=3)
    async def t(ctx: JobContext) -> int:
        return ctx.attempt

    async with q:
        J = q._t.jobs
        jid = await q.enqueue("t")
        async with q.engine.begin() as conn:
            await conn.execute(update(J).where(J.c.id == jid).values(
                state="running", attempts=1, lease_owner="dead-worker",
                lease_expires=datetime.now(UTC) - timedelta(seconds=1)))
        await q.run_until_idle()
        job = await q.get(jid)
    assert job.state == "done" and job.result == 2
    assert [(e["attempt"], e["type"], e["worker"]) for e in job.errors] == [
        (1, "LeaseExpired", "dead-worker")]


async def test_the_success_path_writes_no_history(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()

    @q.handler("ok")
    async def ok(ctx: JobContext, i: int) -> Any:
        return {"i": i} if i % 2 else None  # with and without a result

    async with q:
        seen: list[str] = []

        def spy(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if "errors" in statement.lower():
                seen.append(statement)

        event.listen(q.engine.sync_engine, "before_cursor_execute", spy)
        try:
            parent = await q.enqueue("ok", {"i": 0})
            ids = [await q.enqueue("ok", {"i": i}, depends_on=[parent]) for i in range(1, 5)]
            await q.run_until_idle()
        finally:
            event.remove(q.engine.sync_engine, "before_cursor_execute", spy)
        jobs = [await q.get(i) for i in [parent, *ids]]
    assert [j.state for j in jobs] == ["done"] * 5
    assert [j.errors for j in jobs] == [()] * 5
    assert [s for s in seen if not s.lstrip().lower().startswith("select")] == []

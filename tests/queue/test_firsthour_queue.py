"""What a new user meets in code (issue 33, item 10): ``wait(timeout=)`` says which job it
gave up on and in what state; a manual retry runs now and backs off from the start again;
every state a user can see is in the states diagram of the docs."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from aiojobqueue import JobContext, JobQueue, JobState

ROOT = Path(__file__).resolve().parents[2]


async def test_wait_timeout_names_the_job_and_its_state(queue: JobQueue) -> None:
    jid = await queue.enqueue("nobody-serves-this")
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        await queue.wait(jid, timeout=0.3)
    assert 0.25 < time.monotonic() - t0 < 5
    assert str(info.value) == f"job {jid} is still ready after waiting 0.3s"


async def test_manual_retry_runs_now_and_backs_off_from_the_start(
    make_queue: Callable[..., JobQueue],
) -> None:
    # a backoff long enough to tell the first step (1-2 s) from the third (4-8 s)
    q = make_queue(retry_backoff=2.0, retry_backoff_max=300.0)

    @q.handler("boom", max_attempts=2)
    async def boom(ctx: JobContext) -> None:
        raise RuntimeError(f"attempt {ctx.attempt}")

    async with q:
        jid = await q.enqueue("boom")
        serving = asyncio.create_task(q.serve())
        try:
            async def job_is(state: str, attempts: int) -> bool:
                j = await q.get(jid)
                return j.state == state and j.attempts == attempts

            await _until(lambda: job_is("failed", 2), 30)
            await q.retry(jid)
            retried = datetime.now(UTC)
            await _until(lambda: job_is("scheduled", 3), 10)  # ran at once, failed again
            job = await q.get(jid)
        finally:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
    assert job.started_at is not None and (job.started_at - retried).total_seconds() < 3
    wait = (job.run_after - datetime.now(UTC)).total_seconds()
    # the round's first failure: retry_backoff * [0.5, 1]; before: the job's third, 4-8 s
    assert wait <= 2.0, wait


async def _until(pred: Callable[[], object], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await pred():  # type: ignore[misc]
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_every_state_is_in_the_states_diagram(db: str) -> None:
    text = (ROOT / "docs" / "states.md").read_text()
    diagram = text.split("```mermaid", 1)[1].split("```", 1)[0]
    drawn = set(re.findall(r"(\w+) -->", diagram)) | set(re.findall(r"--> (\w+)", diagram))
    for state in JobState:
        if state is JobState.ACTIVE:  # containers: their own line below the diagram
            assert "waiting --> active" in text
            continue
        assert state.value in drawn, f"{state.value} is not in docs/states.md's diagram"
        assert f"`{state.value}`" in text.split("| state | meaning |", 1)[1]  # the table

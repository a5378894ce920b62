"""The retry policy: ``retry_on`` picks the exceptions worth another attempt, a
``PermanentError`` never is, and what no re-run can fix (args that do not fit the handler, a
result that is not JSON) fails for good at once; a timeout and a lost lease always count as
retryable attempts."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from aiojobqueue import JobContext, JobFailed, JobQueue, JobState, PermanentError

ROOT = Path(__file__).resolve().parents[2]  # the worker processes import this tree


class QuotaExceeded(PermanentError):
    """A user's own permanent error."""


async def run(q: JobQueue, jid: int) -> Any:
    await q.run_until_idle()
    return await q.get(jid)


async def test_an_exception_not_in_retry_on_fails_at_once(queue: JobQueue) -> None:
    calls = 0

    @queue.handler("fetch", max_attempts=5, retry_on=(OSError, KeyError))
    async def fetch(ctx: JobContext) -> None:
        nonlocal calls
        calls += 1
        raise ValueError("bad page")

    jid = await fetch.enqueue()
    job = await run(queue, jid)
    assert job.state == JobState.FAILED and job.attempts == 1 and calls == 1
    assert job.error["type"] == "ValueError" and job.error["message"] == "bad page"
    with pytest.raises(JobFailed, match="ValueError: bad page"):
        await queue.wait(jid, timeout=5)


async def test_an_exception_in_retry_on_is_retried(queue: JobQueue) -> None:
    @queue.handler("fetch", max_attempts=3, retry_on=OSError)  # one class, subclasses too
    async def fetch(ctx: JobContext) -> int:
        if ctx.attempt < 3:
            raise ConnectionResetError("flaky")
        return ctx.attempt

    jid = await fetch.enqueue()
    job = await run(queue, jid)
    assert job.state == JobState.DONE and job.attempts == 3 and job.result == 3


async def test_by_default_every_exception_is_retried(queue: JobQueue) -> None:
    @queue.handler("fetch", max_attempts=3)
    async def fetch(ctx: JobContext) -> None:
        raise LookupError(f"attempt {ctx.attempt}")

    job = await run(queue, await fetch.enqueue())
    assert job.state == JobState.FAILED and job.attempts == 3
    assert job.error["message"] == "attempt 3"


async def test_a_permanent_error_fails_at_once_whatever_retry_on(queue: JobQueue) -> None:
    calls = 0

    @queue.handler("charge", max_attempts=4, retry_on=(Exception,))
    async def charge(ctx: JobContext, fail: str) -> None:
        nonlocal calls
        calls += 1
        raise (QuotaExceeded if fail == "own" else PermanentError)("card declined")

    own = await charge.enqueue({"fail": "own"})
    base = await charge.enqueue({"fail": "base"})
    await queue.run_until_idle()
    for jid, name in ((own, "QuotaExceeded"), (base, "PermanentError")):
        job = await queue.get(jid)
        assert job.state == JobState.FAILED and job.attempts == 1, job
        assert job.error["type"] == name and job.error["message"] == "card declined"
    assert calls == 2


async def test_a_timeout_is_retried_even_with_an_empty_retry_on(queue: JobQueue) -> None:
    @queue.handler("slow", timeout=0.3, max_attempts=2, retry_on=())
    async def slow(ctx: JobContext) -> int:
        if ctx.attempt == 1:
            await asyncio.sleep(30)
        return ctx.attempt

    job = await run(queue, await slow.enqueue())
    assert job.state == JobState.DONE and job.attempts == 2 and job.result == 2


async def test_a_handler_raising_timeout_error_itself_follows_retry_on(queue: JobQueue) -> None:
    """Only the job's own timeout is always retryable; a TimeoutError the handler raises (a
    client library's) is an exception like any other."""

    @queue.handler("call", timeout=30, max_attempts=3, retry_on=(KeyError,))
    async def call(ctx: JobContext) -> None:
        raise TimeoutError("upstream timed out")

    job = await run(queue, await call.enqueue())
    assert job.state == JobState.FAILED and job.attempts == 1
    assert job.error["message"] == "upstream timed out"


async def test_args_that_do_not_fit_at_run_time_fail_at_once(
    make_queue: Callable[..., JobQueue],
) -> None:
    """Enqueued by a process that has no handler for the type (or an older one), run by one
    whose handler takes other args: no re-run can fit them, so the handler is never called."""
    producer, worker = make_queue(), make_queue()
    calls = 0

    @worker.handler("resize", max_attempts=3)
    async def resize(ctx: JobContext, image: str, width: int) -> None:
        nonlocal calls
        calls += 1

    async with producer, worker:
        jid = await producer.enqueue("resize", {"image": "a.png", "widht": 3})
        job = await run(worker, jid)
    assert job.state == JobState.FAILED and job.attempts == 1 and calls == 0
    assert job.error["type"] == "InvalidJobError"
    assert "missing argument 'width'" in job.error["message"]
    assert "unexpected argument 'widht'" in job.error["message"]


async def test_a_result_that_is_not_json_fails_at_once(queue: JobQueue) -> None:
    calls = 0

    @queue.handler("report", max_attempts=3)
    async def report(ctx: JobContext, what: str) -> Any:
        nonlocal calls
        calls += 1
        return {1, 2} if what == "set" else float("nan")

    ids = [await report.enqueue({"what": "set"}), await report.enqueue({"what": "nan"})]
    await queue.run_until_idle()
    for jid in ids:
        job = await queue.get(jid)
        assert job.state == JobState.FAILED and job.attempts == 1, job
        assert job.error["type"] == "NotJSONError" and "report" in job.error["message"]
    assert calls == 2


_WORKER = textwrap.dedent("""
    import asyncio, os, sys
    from aiojobqueue import JobQueue

    url, prefix, marker = sys.argv[1:4]
    q = JobQueue(url, prefix=prefix, lease_ttl=1.5, heartbeat_interval=0.3, poll_interval=0.05,
                 retry_backoff=0.01, retry_backoff_max=0.05)

    @q.handler("hang_once", max_attempts=2, retry_on=())
    async def hang_once(ctx):
        if ctx.attempt == 1:
            open(marker, "w").close()
            await asyncio.sleep(3600)
        return {"attempt": ctx.attempt, "pid": os.getpid()}

    asyncio.run(q.serve())
""")


@pytest.mark.slow
async def test_a_lost_lease_is_retried_even_with_an_empty_retry_on(
    make_queue: Callable[..., JobQueue], db_url: str, prefix: str, tmp_path: Path,
) -> None:
    """A worker SIGKILLed mid-attempt: its lease expires and another worker process runs the
    job again, although its handler retries no exception."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    marker = tmp_path / "started"
    procs: list[subprocess.Popen[bytes]] = []

    def spawn() -> subprocess.Popen[bytes]:
        p = subprocess.Popen([sys.executable, "-c", _WORKER, db_url, prefix, str(marker)],
                             env=env, stderr=subprocess.PIPE)
        procs.append(p)
        return p

    try:
        async with make_queue() as q:  # the producer: no handler, no worker
            jid = await q.enqueue("hang_once", {})
            first = spawn()
            deadline = time.monotonic() + 60
            while not marker.exists():
                assert first.poll() is None, first.stderr.read() if first.stderr else ""
                assert time.monotonic() < deadline, "attempt 1 never started"
                await asyncio.sleep(0.05)
            first.kill()
            first.wait()
            second = spawn()
            result = await q.wait(jid, timeout=60)
            job = await q.get(jid)
        assert result == {"attempt": 2, "pid": second.pid}
        assert job.state == JobState.DONE and job.attempts == 2
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()

"""Attempts a user can read (issue 33, item 2): runs, failures, releases and the limit in
force, the same words in ``Job``, the command line and the dashboard. The issue's cases:
``attempts 4 of 3`` after two graceful releases and a success; ``failed 4/2`` after a
manual retry."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
from clikit import acli
from conftest import eventually

from aiojobqueue import JobContext, JobQueue, JobState
from aiojobqueue.attempts import attempts_short, attempts_text
from aiojobqueue.web import dashboard


async def _page(q: JobQueue, path: str) -> str:
    app = dashboard(q, access=lambda request: "read")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://test") as http:
        r = await http.get(path)
        assert r.status_code == 200, r.text
        return r.text


async def test_two_graceful_releases_and_a_success(
    db_url: str, prefix: str, make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue(shutdown_timeout=0.2)
    started = asyncio.Event()
    finish = asyncio.Event()

    @q.handler("slow", max_attempts=3)
    async def slow(ctx: JobContext) -> str:
        started.set()
        if ctx.attempt < 3:
            await asyncio.sleep(60)  # interrupted by the shutdown: released
        await finish.wait()
        return "ok"

    async with q:
        jid = await q.enqueue("slow")
        for _ in range(2):  # serve, and stop gracefully while the job runs
            started.clear()
            serving = asyncio.create_task(q.serve())
            await asyncio.wait_for(started.wait(), 30)
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
        finish.set()
        await q.run_until_idle()
        job = await q.get(jid)
        page = await _page(q, f"/jobs/{jid}")
        listing = await _page(q, "/jobs")
    assert job.state == JobState.DONE and job.attempts == 3
    assert (job.runs, job.failures, job.releases) == (1, 0, 2)
    assert attempts_short(job) == "1/3"
    text = attempts_text(job, job.failures)
    assert text == "1 run, 2 released (not counted); attempt 1 of 3"
    assert text.replace("(", "&#40;") in page or text in page, page
    assert "1/3" in listing
    p = await acli("show", str(jid), env={"AIOJOBQUEUE_URL": db_url,
                                          "AIOJOBQUEUE_PREFIX": prefix})
    assert text in p.stdout, p.stdout
    p = await acli("jobs", env={"AIOJOBQUEUE_URL": db_url, "AIOJOBQUEUE_PREFIX": prefix})
    assert " 1/3 " in p.stdout, p.stdout


async def test_failures_after_a_manual_retry(
    db_url: str, prefix: str, make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue()

    @q.handler("explode", max_attempts=2)
    async def explode(ctx: JobContext) -> None:
        raise RuntimeError(f"kaboom {ctx.attempt}")

    async with q:
        jid = await q.enqueue("explode")
        await q.run_until_idle()
        await eventually(lambda: _state(q, jid, JobState.FAILED), timeout=30)
        await q.retry(jid)
        await q.run_until_idle()
        await eventually(lambda: _state(q, jid, JobState.FAILED), timeout=30)
        job = await q.get(jid)
    assert (job.attempts, job.runs, job.failures, job.releases) == (4, 4, 4, 0)
    assert job.attempt_limit == 4
    assert attempts_short(job) == "2/2 ↻"
    assert attempts_text(job, job.failures) == (
        "4 runs, 4 failed; attempt 2 of 2 since the manual retry")
    p = await acli("jobs", env={"AIOJOBQUEUE_URL": db_url, "AIOJOBQUEUE_PREFIX": prefix})
    assert "2/2 ↻" in p.stdout, p.stdout


async def _state(q: JobQueue, jid: int, state: JobState) -> bool:
    return (await q.get(jid)).state == state


async def test_v9_database_gets_the_releases_column(make_queue: Callable[..., JobQueue]) -> None:
    """A v9 database (no ``releases``) is upgraded in place: the column added, NOT NULL
    DEFAULT 0, its jobs kept and readable."""
    from sqlalchemy import inspect, text, update

    q = make_queue()
    async with q:
        jid = await q.enqueue("x")
        J, M = q._t.jobs, q._t.meta
        async with q.engine.begin() as conn:
            await conn.execute(text(f"ALTER TABLE {J.name} DROP COLUMN releases"))
            await conn.execute(update(M).where(M.c.name == "schema_version").values(value="9"))
    q2 = make_queue()
    async with q2:
        async with q2.engine.connect() as conn:
            cols = await conn.run_sync(
                lambda c: {x["name"]: x for x in inspect(c).get_columns(J.name)})
        job = await q2.get(jid)
        later = await q2.enqueue("x")
        assert (await q2.get(later)).releases == 0
    assert "releases" in cols and not cols["releases"]["nullable"]
    assert job.releases == 0 and job.attempts == 0

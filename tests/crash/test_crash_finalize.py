"""Finalize never strands a job: a finalize write that fails (the database link drops) is
retried by the worker; a finalize that committed although its answer was lost is neither
applied twice nor reported as lost. (A worker that dies before finalizing: see
test_crash_reclaim.) Network faults come from a TCP proxy, so only this test's
connections suffer."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
from finalizekit import watched_queue
from tcpproxy import TcpProxy

from aiojobqueue import JobContext, JobQueue, JobState

SERVERS = pytest.mark.parametrize("db", ["postgresql", "mariadb"], indirect=True)


@SERVERS
async def test_finalize_write_failure_is_retried(
    make_queue: Callable[..., JobQueue], db_url: str, prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "aiojobqueue")
    async with make_queue() as observer, TcpProxy.for_url(db_url) as px:
        q, events = watched_queue(px.url(db_url), prefix)
        calls: list[int] = []

        @q.handler("step")
        async def step(ctx: JobContext) -> dict[str, int]:
            calls.append(ctx.attempt)
            # the database goes away just as the job finishes: its finalize must wait it out
            px.refuse()
            px.cut()
            asyncio.get_running_loop().call_later(1.0, px.allow)
            return {"attempt": ctx.attempt}

        jid = await observer.enqueue("step", {})
        async with q:
            serving = asyncio.create_task(q.serve())
            try:
                assert await observer.wait(jid, timeout=30) == {"attempt": 1}
            finally:
                serving.cancel()
                await asyncio.gather(serving, return_exceptions=True)
        job = await observer.get(jid)
        assert job.state == JobState.DONE and job.attempts == 1
        assert calls == [1] and events == ["done"]
        assert "finalize of 1 job(s) failed" in caplog.text


@SERVERS
async def test_commit_whose_answer_was_lost_is_finalized_once(
    make_queue: Callable[..., JobQueue], db_url: str, prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "aiojobqueue")
    async with make_queue() as observer, TcpProxy.for_url(db_url) as px:
        q, events = watched_queue(px.url(db_url), prefix)
        calls: list[int] = []
        routines: list[bool] = []  # whether each attempt's finalize is the routine's call
        marker = "AMBIGUOUS-7f3a9c"

        @q.handler("step")
        async def step(ctx: JobContext) -> dict[str, Any]:
            calls.append(ctx.attempt)
            # the finalize carrying this result commits, but its answer never arrives (on
            # PostgreSQL it is one call of the finalize routine, in autocommit)
            routine = q._core is not None and q._core.finalizer.settle_call is not None
            routines.append(routine)
            px.cut_after_commit(marker.encode(), autocommit=routine)
            return {"tag": marker, "attempt": ctx.attempt}

        jid = await observer.enqueue("step", {})
        after = await observer.enqueue("step", {}, depends_on=[jid])
        async with q:
            serving = asyncio.create_task(q.serve())
            try:
                assert (await observer.wait(jid, timeout=30))["attempt"] == 1
                second = (await observer.wait(after, timeout=30))["attempt"]
                await asyncio.sleep(0.5)  # let any stray second finalize show itself
            finally:
                serving.cancel()
                await asyncio.gather(serving, return_exceptions=True)
        assert px.ambiguous_commits >= 1, "the fault was not injected"
        job = await observer.get(jid)
        assert job.state == JobState.DONE and job.attempts == 1
        assert calls == [1, second]  # each job ran once; nothing re-ran
        assert (await observer.get(after)).attempts == second
        if second != 1:
            # On PostgreSQL the call whose answer was lost may also have leased `after` (the
            # claim rides along with the finalize at a DAG step): that lease, unknown to the
            # worker, is released as an orphan (an attempt starts at each claim), never run.
            assert f"not running here: [{after}]" in caplog.text
            assert routines[0]  # (read while the queue ran: it is closed by now)
        assert events == ["done", "done"], events  # reported applied, not "discarded"
        assert "committed though its answer was lost" in caplog.text


@pytest.mark.parametrize("db", ["postgresql"], indirect=True)  # its autocommit finalize
async def test_one_statement_finalize_whose_answer_was_lost_is_finalized_once(
    make_queue: Callable[..., JobQueue], db_url: str, prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A plain success (no result, no parent, no dependents) is finalized by one UPDATE in
    autocommit. Its answer lost after it committed: the job is not run again, not finalized
    twice, and reported done (not discarded)."""
    caplog.set_level(logging.WARNING, "aiojobqueue")
    async with make_queue() as observer, TcpProxy.for_url(db_url) as px:
        q, events = watched_queue(px.url(db_url), prefix)
        calls: list[int] = []

        @q.handler("step")
        async def step(ctx: JobContext) -> None:
            calls.append(ctx.attempt)
            px.cut_after_statement(b"has_dependents = false")  # finish_fast's UPDATE

        jid = await observer.enqueue("step", {})
        async with q:
            serving = asyncio.create_task(q.serve())
            try:
                assert await observer.wait(jid, timeout=30) is None
                await asyncio.sleep(0.5)  # let any stray second finalize show itself
            finally:
                serving.cancel()
                await asyncio.gather(serving, return_exceptions=True)
        assert px.ambiguous_commits == 1, "the fault was not injected"
        job = await observer.get(jid)
        assert job.state == JobState.DONE and job.attempts == 1
        assert calls == [1] and events == ["done"], (calls, events)
        assert "committed though its answer was lost" in caplog.text


@pytest.mark.parametrize("db", ["postgresql"], indirect=True)  # JSONB refuses \u0000
async def test_an_outcome_the_database_refuses_does_not_block_the_others(
    make_queue: Callable[..., JobQueue], caplog: pytest.LogCaptureFixture,
) -> None:
    """A result that passes JSON checks but that the column refuses (PostgreSQL JSONB cannot
    hold \\u0000) is not retried forever holding its job and its batch-mates hostage: the
    others are written, and the bad attempt fails with FinalizeError."""
    caplog.set_level(logging.WARNING, "aiojobqueue")
    q = make_queue()
    gate = asyncio.Event()

    @q.handler("emit")
    async def emit(ctx: JobContext, text: str) -> dict[str, str]:
        await gate.wait()  # finish together: one finalize batch
        return {"text": text.replace("NUL", "\x00")}

    async with q:
        bad = await q.enqueue("emit", {"text": "NUL"}, max_attempts=1)
        good = [await q.enqueue("emit", {"text": f"fine {i}"}) for i in range(3)]
        serving = asyncio.create_task(q.serve())
        try:
            await asyncio.sleep(0.5)
            gate.set()
            for g in good:
                assert (await q.wait(g, timeout=20))["text"].startswith("fine")
            job = None
            for _ in range(200):
                job = await q.get(bad)
                if job.state == JobState.FAILED:
                    break
                await asyncio.sleep(0.1)
        finally:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
        assert job is not None and job.state == JobState.FAILED, job
        assert job.error["type"] == "FinalizeError"
        assert "could not be recorded" in job.error["message"]

"""A claim whose COMMIT succeeded but whose answer was lost leaves a job leased to a worker
that does not know it runs it. The worker must not keep that lease alive (it only renews
what it runs) and releases it itself: the job runs soon, not after lease_ttl, and the lost
attempt is not held against it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
from tcpproxy import TcpProxy

from aiojobqueue import JobContext, JobQueue, JobState
from aiojobqueue.lease import ReturningLease
from aiojobqueue.worker.loop import ROUNDS
from aiojobqueue.worker.pg_rounds import AutocommitRound

SERVERS = pytest.mark.parametrize("db", ["postgresql", "mariadb"], indirect=True)


async def _declined(*_args: Any) -> None:
    return None


@SERVERS
async def test_claim_with_lost_commit_answer_is_released_not_stranded(
    make_queue: Callable[..., JobQueue], db_url: str, prefix: str,
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.WARNING, "aiojobqueue")
    # The fault is found by the probe's group name in what the claim sends: PostgreSQL's
    # fair pick and idle pick read the names from the index and send none, so they are
    # declined here (the census and the pick of the group then lease it, by name). The
    # release of an orphan does not depend on the statement that leased it: it reads the
    # rows leased to this worker that it does not run.
    monkeypatch.setattr(ReturningLease, "pick_fair", _declined)
    monkeypatch.setattr(ReturningLease, "pick_idle", _declined)
    async with make_queue() as observer, TcpProxy.for_url(db_url) as px:
        # a long lease: if the orphan had to wait for expiry the test would time out
        q = JobQueue(px.url(db_url), prefix=prefix, poll_interval=0.05, lease_ttl=30.0,
                     heartbeat_interval=0.3, shutdown_timeout=0.5)
        ran: list[tuple[int, int]] = []
        busy = asyncio.Event()

        @q.handler("step")
        async def step(ctx: JobContext, seconds: float) -> int:
            ran.append((ctx.job_id, ctx.attempt))
            busy.set()
            await asyncio.sleep(seconds)
            return ctx.attempt

        long_id = await observer.enqueue("step", {"seconds": 4.0})
        async with q:
            serving = asyncio.create_task(q.serve())
            try:
                await asyncio.wait_for(busy.wait(), 20)  # this worker now renews a lease
                group = "orphan-probe-group"  # appears only in the claim that takes the probe
                # where the claim runs in autocommit, its own answer is its commit's
                px.cut_after_commit(group.encode(), autocommit=issubclass(
                    ROUNDS[q._core.round_kind], AutocommitRound) and not q.settings.needs_gate)
                t0 = time.monotonic()
                probe = await observer.enqueue("step", {"seconds": 0.0}, group=group,
                                               max_attempts=1)
                assert await observer.wait(probe, timeout=15) == 2
                took = time.monotonic() - t0
                assert await observer.wait(long_id, timeout=15) == 1
            finally:
                serving.cancel()
                await asyncio.gather(serving, return_exceptions=True)
        assert px.ambiguous_commits == 1, "the fault was not injected"
        job = await observer.get(probe)
        # attempt 1 was leased but never run; max_attempts=1 and it still ran as attempt 2
        assert job.state == JobState.DONE and job.attempts == 2
        assert [r for r in ran if r[0] == probe] == [(probe, 2)]
        assert "leased to this worker but not running here" in caplog.text
        assert took < 10.0  # a few heartbeats, far below lease_ttl (30 s)
        print(f"orphaned lease released and job done {took:.2f}s after its claim")

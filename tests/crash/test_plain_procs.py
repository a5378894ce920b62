"""Plain ``def`` handlers in real worker processes: a handler that spins in pure Python
(holding the GIL but for each switch interval) far longer than lease_ttl keeps its lease,
since the loop thread still renews it; a SIGKILLed worker's plain job re-runs elsewhere."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from crashkit import Fleet, fleet_factory  # noqa: F401 - fixture

from aiojobqueue import JobQueue, JobState


@pytest.mark.slow
async def test_a_gil_holding_plain_handler_keeps_its_lease(
    make_queue: Callable[..., JobQueue], fleet_factory: Callable[..., Fleet]  # noqa: F811
) -> None:
    async with make_queue() as q:
        fleet = fleet_factory(ttl=2.0, hb=0.4)
        a = await fleet.start_one()
        jid = await q.enqueue("spin", {"seconds": 6.0})  # 3 x lease_ttl, in pure Python
        await fleet.wait_for("start", job=jid)
        b = fleet.spawn()  # its reclaimer would take the lease, were it to expire
        await fleet.ready(b)
        res = await q.wait(jid, timeout=60)
        job = await q.get(jid)
        assert job.state == JobState.DONE and job.attempts == 1, fleet.dump()
        assert res["pid"] == a.pid and res["spins"] > 0
        assert len(fleet.events("start", job=jid)) == 1
        assert job.progress is not None and job.progress["total"] == 6.0
        await fleet.wait_for("fin", job=jid)
        assert not fleet.events("released") and not fleet.events("discarded"), fleet.dump()
        assert "reclaimed" not in fleet.worker_logs()


@pytest.mark.slow
async def test_a_sigkilled_workers_plain_job_runs_again_and_finishes_once(
    make_queue: Callable[..., JobQueue], fleet_factory: Callable[..., Fleet]  # noqa: F811
) -> None:
    async with make_queue() as q:
        fleet = fleet_factory(ttl=2.0, hb=0.4)
        a = await fleet.start_one()
        jid = await q.enqueue("plain_sleep", {"seconds": 1.0})
        await fleet.wait_for("start", job=jid)
        fleet.kill(a)
        b = await fleet.start_one()
        res = await q.wait(jid, timeout=60)
        job = await q.get(jid)
        assert job.state == JobState.DONE and job.attempts == 2, fleet.dump()
        assert res["pid"] == b.pid
        await fleet.wait_for("fin", job=jid)
        assert len(fleet.events("fin", job=jid)) == 1

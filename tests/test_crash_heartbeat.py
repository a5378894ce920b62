"""Heartbeats: a job running far longer than lease_ttl keeps its lease (no other worker
process reclaims it), and settings that leave no room between beats are rejected."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from crashkit import Fleet, fleet_factory  # noqa: F401 - fixture

from aiojobqueue import JobQueue, JobState
from aiojobqueue.errors import ConfigurationError


@pytest.mark.parametrize(("ttl", "hb"), [(1.0, 1.0), (1.9, 1.0), (0.5, 10.0)])
def test_lease_not_comfortably_above_heartbeat_is_rejected(ttl: float, hb: float) -> None:
    with pytest.raises(ConfigurationError, match="heartbeat_interval"):
        JobQueue("sqlite+aiosqlite:///unused.db", lease_ttl=ttl, heartbeat_interval=hb)
    JobQueue("sqlite+aiosqlite:///unused.db", lease_ttl=2 * hb, heartbeat_interval=hb)


@pytest.mark.slow
async def test_job_three_times_longer_than_lease_completes_once(
    make_queue: Callable[..., JobQueue], fleet_factory: Callable[..., Fleet]  # noqa: F811
) -> None:
    async with make_queue() as q:
        fleet = fleet_factory(ttl=2.0, hb=0.4)
        a = fleet.spawn()
        await fleet.ready(a)
        jid = await q.enqueue("sleep", {"seconds": 6.0})  # 3 x lease_ttl
        await fleet.wait_for("start", job=jid)
        b = fleet.spawn()  # a second worker whose reclaimer would take an expired lease
        await fleet.ready(b)
        res = await q.wait(jid, timeout=40)
        job = await q.get(jid)
        assert job.state == JobState.DONE and job.attempts == 1, fleet.dump()
        assert res["pid"] == a.pid
        assert len(fleet.events("start", job=jid)) == 1
        assert len(fleet.events("fin", job=jid)) == 1
        assert not fleet.events("cancelled") and not fleet.events("discarded")
        assert "reclaimed" not in fleet.worker_logs()

"""queue.cancel() of a job running in another worker process stops its handler within about
one heartbeat; the job ends cancelled and its dependents are cancelled."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from crashkit import Fleet, fleet_factory  # noqa: F401 - fixture

from aiojobqueue import JobCancelled, JobQueue, JobState


@pytest.mark.slow
async def test_cancel_stops_a_job_running_in_another_process(
    make_queue: Callable[..., JobQueue], fleet_factory: Callable[..., Fleet]  # noqa: F811
) -> None:
    async with make_queue() as q:
        fleet = fleet_factory(ttl=2.0, hb=0.4)
        a = await fleet.start_one()
        jid = await q.enqueue("sleep", {"seconds": 60.0})
        dep = await q.enqueue("sleep", {"seconds": 0.0}, depends_on=[jid])
        dep2 = await q.enqueue("sleep", {"seconds": 0.0}, depends_on=[dep])
        await fleet.wait_for("start", job=jid)
        fleet.note("cancel", job=jid)
        await q.cancel(jid)
        t_cancel = fleet.events("cancel")[0]["t"]
        stopped = await fleet.wait_for("cancelled", timeout=15, job=jid, pid=a.pid)
        latency = stopped["t"] - t_cancel
        assert latency < 0.4 + 3.0, fleet.dump()  # one heartbeat + a loaded machine
        print(f"handler stopped {latency:.2f}s after cancel() (heartbeat 0.4 s)")
        with pytest.raises(JobCancelled):
            await q.wait(jid, timeout=10)
        for d in (dep, dep2):
            with pytest.raises(JobCancelled) as ei:
                await q.wait(d, timeout=10)
            assert ei.value.error["type"] == "UpstreamFailed"
        assert "upstream" in (await q.get(dep)).error["message"]
        job = await q.get(jid)
        assert job.state == JobState.CANCELLED and job.attempts == 1
        assert len(fleet.events("cancel_fin", job=jid)) == 1
        assert not fleet.events("start", job=dep)
        assert a.poll() is None

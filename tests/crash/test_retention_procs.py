"""Retention across 3 worker processes, with a SIGKILL of the sweeping one.

Old finished DAGs are deleted while new DAGs keep running, and the worker that sweeps is
SIGKILLed after its first committed batch: another takes the lease over once it expires
and finishes. The timeline (every handler's end events and every committed ``swept`` batch)
proves: every old DAG went, whole; every DAG that went had finished at least the retention
before (nothing live or recent touched); the DAGs kept on purpose (a live dependent, a live
child) are all there; no id was deleted twice.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from datetime import timedelta

from crashkit import Fleet, fleet_factory  # noqa: F401 - the fixture
from sqlalchemy import select

from aiojobqueue import JobQueue

RETAIN = 2.0  # seconds, for "done"


async def dag(q: JobQueue, ms: int = 20) -> list[int]:
    """A container of two chained jobs and a job after the container."""
    async with q.batch() as b:
        box = b.container("box")
        a = b.add("sleep", {"seconds": ms / 1000}, parent=box)
        c = b.add("sleep", {"seconds": ms / 1000}, parent=box, depends_on=[a])
        d = b.add("sleep", {"seconds": ms / 1000}, depends_on=[box])
    return [box.id, a.id, c.id, d.id]


async def present(q: JobQueue) -> dict[int, str]:
    J = q._t.jobs
    return {r[0]: r[1] for r in await q._read(lambda c: c.execute(select(J.c.id, J.c.state)))}


async def test_retention_sweep_survives_sigkill(
        make_queue: Callable[..., JobQueue], fleet_factory: Callable[..., Fleet],  # noqa: F811
) -> None:
    # (make_queue first: its teardown drops the tables after the fleet's has ended it)
    q = make_queue()
    await q.start()
    fleet = fleet_factory(retention=json.dumps({"done": RETAIN}), sweep_every=0.3,
                          sweep_ttl=1.5, sweep_batch=2, sweep_pause=0.15, capacity=8)
    procs = [await fleet.start_one() for _ in range(3)]
    # kept on purpose: a done job with a live dependent; a container with a live child
    up = await q.enqueue("sleep", {"seconds": 0})
    async with q.batch() as b:
        box = b.container("box")
        done_child = b.add("sleep", {"seconds": 0}, parent=box)
        live_child = b.add("sleep", {"seconds": 0}, parent=box, run_after=timedelta(hours=1))
    await asyncio.sleep(0.5)
    down = await q.enqueue("sleep", {"seconds": 0}, depends_on=[up],
                           run_after=timedelta(hours=1))
    kept = {up, down, box.id, done_child.id, live_child.id}
    old = [await dag(q) for _ in range(30)]
    fleet.note("old_enqueued")
    # new DAGs keep coming while the sweep runs and while its worker is killed
    new: list[list[int]] = []
    killed: int | None = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        new.append(await dag(q, 50))
        swept = fleet.events("swept")
        if killed is None and swept:
            victim = next(p for p in procs if p.pid == swept[0]["pid"])
            fleet.kill(victim)
            killed = victim.pid
        gone = {i for e in fleet.events("swept") for i in e["ids"]}
        if killed is not None and all(set(d) <= gone for d in old):
            break
        await asyncio.sleep(0.1)
    assert killed is not None, fleet.dump()
    await asyncio.sleep(1.0)  # the last new DAGs finish (some may age and go too)

    ev = fleet.events()
    swept = [e for e in ev if e["ev"] == "swept"]
    ids = [i for e in swept for i in e["ids"]]
    assert len(ids) == len(set(ids)), "an id deleted twice"
    gone = set(ids)
    # the takeover: a batch by another process after the kill
    t_kill = next(e["t"] for e in ev if e["ev"] == "kill")
    assert any(e["pid"] != killed and e["t"] > t_kill for e in swept), fleet.dump()
    # every old DAG went, whole
    for d in old:
        assert set(d) <= gone, (d, fleet.dump())
    # whatever went had finished >= RETAIN before its batch committed. The bound is each
    # job's last ``end`` (its handler returned; the finalize stamps ``finished_at`` later), not
    # its ``fin`` (the hook after the commit): a commit that waits on the disk is visible to
    # the sweep before the committing worker hears back, so ``fin`` may trail ``finished_at``
    # by seconds under load (MariaDB in CI: 1.9 s). A container has no handler: its children's
    # and its dependent's ends bound it. (0.1 s: the databases' timestamp rounding.)
    end = {e["job"]: e["t"] for e in ev if e["ev"] == "end"}
    when = {i: e["t"] for e in swept for i in e["ids"]}
    for d in [*old, *new]:
        went = set(d) & gone
        if not went:
            continue
        assert went == set(d), f"DAG {d} partly deleted: {went}"
        last = max(end[j] for j in d if j in end)
        assert min(when[j] for j in d) - last >= RETAIN - 0.1, (d, fleet.dump())
    # the kept ones are all there, in the state they had
    now = await present(q)
    assert kept <= set(now)
    assert now[down] == "scheduled" and now[live_child.id] == "scheduled"
    assert now[box.id] == "active" and now[up] == "done"
    assert not gone & kept
    # nothing live was deleted: every id still present or logged gone, never both
    assert not gone & set(now)
    pids = sorted({e["pid"] for e in swept})
    takeover = min(e["t"] for e in swept if e["pid"] != killed) - t_kill
    print(f"\nswept batches {len(swept)} by pids {pids}, killed {killed}, old DAGs "
          f"{len(old)}, new DAGs {len(new)} ({sum(set(d) <= gone for d in new)} gone), "
          f"takeover after {takeover:.2f}s")
    await q.close()

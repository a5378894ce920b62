"""External steps and run conditions under chaos: a random DAG mixing worker jobs (some with
when="failed" or when="finished") and external steps (completed, failed, or left to time
out) run by 3 worker processes SIGKILLed every 0.25-0.6 s and
replaced, while this process completes and fails the steps as they become ``external``.
Afterwards every node is in exactly the state a pure reference model of the rules predicts
(an upstream that did not end done cancels what waits on it, except a job with a run
condition: "finished" runs, "failed" runs, or is cancelled where every upstream ended
done), a second complete()/fail()
of each step was refused and changed nothing, and no step timed out before its time."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import pytest
from crashkit import Fleet, fleet_factory  # noqa: F401 - fixture
from sqlalchemy import select

from aiojobqueue import InvalidStateError, JobQueue

JOB, COMPLETE, FAIL, TIMEOUT = "job", "complete", "fail", "timeout"
#: worker jobs with a run condition: when="failed" and when="finished"
ONFAIL, ALWAYS = "onfail", "always"
#: also the run's shortest length (six steps of this seed time out, each after its upstream
#: ended): at one SIGKILL per 0.25-0.6 s it sees at least three, however fast the database
#: (PostgreSQL 18 ended a run with 1.5 after two)
TIMEOUT_S = 3.0


def shape(rnd: random.Random, n: int = 160) -> list[tuple[str, list[int]]]:
    """Per node: its kind and the earlier nodes it depends on (0 to 3)."""
    out: list[tuple[str, list[int]]] = []
    for i in range(n):
        kind = rnd.choices([JOB, COMPLETE, FAIL, TIMEOUT, ONFAIL, ALWAYS],
                           [56, 16, 6, 6, 8, 8])[0]
        ups = sorted(rnd.sample(range(i), min(i, rnd.choice([0, 1, 1, 2, 3]))))
        if kind == ONFAIL and not ups:  # refused at insert: it could never run
            kind = JOB
        out.append((kind, ups))
    return out


def model(nodes: list[tuple[str, list[int]]]) -> list[str]:
    """The final state of every node, by the rules (nodes come in topological order)."""
    out: list[str] = []
    for kind, ups in nodes:
        if kind == ALWAYS:  # runs once every dependency ended, whatever the outcome
            out.append("done")
        elif kind == ONFAIL:  # runs if one did not end done; else its condition cannot hold
            out.append("done" if any(out[u] != "done" for u in ups) else "cancelled")
        elif any(out[u] != "done" for u in ups):
            out.append("cancelled")
        else:
            out.append("done" if kind in (JOB, COMPLETE) else "failed")
    return out


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_external_steps_under_sigkills_end_as_the_model_says(
    make_queue: Callable[..., JobQueue], fleet_factory: Callable[..., Fleet],  # noqa: F811
    db: str,
) -> None:
    rnd = random.Random(20261206)
    nodes = shape(rnd)
    want = model(nodes)
    assert {"done", "failed", "cancelled"} <= set(want)
    async with make_queue() as q:
        refs: list[Any] = []
        async with q.batch() as b:
            for kind, ups in nodes:
                deps = [refs[u] for u in ups]
                if kind in (JOB, ONFAIL, ALWAYS):
                    when = {JOB: "done", ONFAIL: "failed", ALWAYS: "finished"}[kind]
                    refs.append(b.add("chaos", {"ms": rnd.randint(0, 20)}, depends_on=deps,
                                      max_attempts=20, when=when))
                else:
                    refs.append(b.external(kind, depends_on=deps, timeout=TIMEOUT_S
                                           if kind == TIMEOUT else 3600))
        ids = [r.id for r in refs]
        kind_of = {ids[i]: k for i, (k, _) in enumerate(nodes)}
        fleet = fleet_factory(ttl=4.0, hb=0.5, capacity=4, shutdown_timeout=1.0, poll=0.05)
        for _ in range(3):
            fleet.spawn()
        J = q._t.jobs
        ended: set[int] = set()
        refused = 0
        kills = 0
        deadline = time.monotonic() + 150
        next_kill = time.monotonic() + rnd.uniform(0.25, 0.6)
        while True:
            rows = {r.id: r for r in await q._read(lambda conn: _rows(conn, J))}
            if all(r.state in ("done", "failed", "cancelled") for r in rows.values()):
                break
            assert time.monotonic() < deadline, fleet.dump()
            for jid, r in rows.items():
                k = kind_of[jid]
                if r.state != "external" or k not in (COMPLETE, FAIL) or jid in ended:
                    continue
                if k == COMPLETE:
                    # the shape the chaos handler reads of its dependencies' results
                    await q.complete(jid, {"job": jid, "attempt": 0})
                else:
                    await q.fail(jid, f"step {jid} refused")
                ended.add(jid)
                # the webhook again: refused, nothing changed
                with pytest.raises(InvalidStateError, match="already"):
                    await (q.complete(jid, "again") if rnd.random() < 0.5
                           else q.fail(jid, "again"))
                refused += 1
            if time.monotonic() >= next_kill:
                alive = fleet.alive()
                fleet.kill(rnd.choice(alive))
                kills += 1
                fleet.spawn()
                next_kill = time.monotonic() + rnd.uniform(0.25, 0.6)
            await asyncio.sleep(0.05)
        for p in fleet.alive():
            fleet.term(p)
        for p in fleet.procs:
            p.wait(timeout=30)
        rows = {r.id: r for r in await q._read(lambda conn: _rows(conn, J))}
        got = [rows[i].state for i in ids]
        wrong = [(i, nodes[n][0], got[n], want[n], rows[i].error)
                 for n, i in enumerate(ids) if got[n] != want[n]]
        assert not wrong, wrong[:10]
        for jid, k in kind_of.items():
            r = rows[jid]
            if k == COMPLETE and r.state == "done":
                assert r.result == {"job": jid, "attempt": 0}  # the first complete() only
            if k == FAIL and r.state == "failed":
                assert r.error["message"] == f"step {jid} refused"
            if k == TIMEOUT and r.state == "failed":
                assert r.error["type"] == "ExternalTimeout"
                # never before its time (database times)
                assert (r.finished_at - r.started_at).total_seconds() >= TIMEOUT_S
                with pytest.raises(InvalidStateError, match="already failed"):
                    await q.complete(jid, "too late")
        assert kills >= 3 and refused >= 10, (kills, refused)
        assert "Traceback" not in fleet.worker_logs()
        assert await q._read(lambda conn: _rows(conn, J)) == list(rows.values())
        print(f"\nWORKFLOW CHAOS {db}: {len(ids)} nodes "
              f"({sum(1 for k in kind_of.values() if k in (COMPLETE, FAIL, TIMEOUT))} external, "
              f"{sum(1 for k in kind_of.values() if k in (ONFAIL, ALWAYS))} with a run "
              f"condition), {kills} SIGKILLs, "
              f"{refused} second calls refused; states as the model: "
              f"{ {s: want.count(s) for s in set(want)} }")


async def _rows(conn: Any, J: Any) -> list[Any]:
    return list(await conn.execute(
        select(J.c.id, J.c.state, J.c.result, J.c.error, J.c.started_at, J.c.finished_at)
        .order_by(J.c.id)))

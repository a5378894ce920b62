"""The chaos machinery: random DAG shapes, a fleet of worker processes SIGKILLed at random
moments, and the checks of the guarantees from the database and the event log (see
test_chaos.py for what they are).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from crashkit import Fleet, by_job
from sqlalchemy import select

from aiojobqueue import JobQueue, JobState

N_JOBS = 600
WORKERS = 3
TTL = 4.0


Shape = list[tuple[int, list[int]]]  # per job: its sleep in ms, the indexes it depends on


def random_dag(rnd: random.Random) -> Shape:
    """N_JOBS jobs of 30-300 ms, each on 0-3 of the 80 jobs before it."""
    out: Shape = []
    for i in range(N_JOBS):
        window = list(range(max(0, i - 80), i))
        ups = rnd.sample(window, k=min(len(window), rnd.choice([0, 1, 1, 2, 3])))
        out.append((rnd.randint(30, 300), ups))
    return out


def chains(rnd: random.Random, n: int = 6, length: int = 120) -> Shape:
    """``n`` chains of ``length`` short jobs (10-50 ms), each on the one before it: fewer
    runnable jobs than slots, so each step is leased by the finalize of the one before it
    where the database can (PostgreSQL's riding claim)."""
    return [(rnd.randint(10, 50), [i - n] if i >= n else []) for i in range(n * length)]


def fan_outs(rnd: random.Random, layers: int = 8, width: int = 60) -> Shape:
    """``layers`` of a head, ``width`` jobs on it and a tail on those (the next head on the
    tail): wide enough that each head's release is split (workers run with ``--split 8``:
    more than max(4 x capacity, 8) = 16 dependents) and its rest released apart."""
    out: Shape = []
    for _ in range(layers):
        head = len(out)
        out.append((rnd.randint(10, 30), [head - 1] if head else []))
        # long enough in all that the run sees several kills, however fast the database
        out += [(rnd.randint(40, 160), [head]) for _ in range(width)]
        out.append((rnd.randint(10, 30), list(range(head + 1, head + 1 + width))))
    return out


def running_pids(fleet: Fleet) -> set[int]:
    """The workers with an attempt started and not ended, per the event log."""
    running: dict[tuple[int, int], int] = {}
    for e in fleet.events():
        if e["ev"] == "start":
            running[(e["job"], e["attempt"])] = e["pid"]
        elif e["ev"] == "end":
            running.pop((e["job"], e["attempt"]), None)
    return set(running.values())


async def chaos(
    make_queue: Callable[..., JobQueue], fleet_factory: Callable[..., Fleet],
    db: str, rnd: random.Random, shape: Shape, poll: float, **worker: Any,
) -> list[dict[str, Any]]:
    """Run ``shape`` on WORKERS worker processes (``worker``: more options of theirs),
    SIGKILLing one every 1-2.5 s (and starting another; the moments and victims drawn from
    ``rnd``), then check the guarantees above from the database and the event log. Returns
    the events."""
    n_jobs = len(shape)
    async with make_queue() as q:
        refs: list[Any] = []
        async with q.batch() as b:
            for ms, ups in shape:
                refs.append(b.add("chaos", {"ms": ms}, depends_on=[refs[u] for u in ups],
                                  max_attempts=20))
        ids = [r.id for r in refs]
        deps = {ids[i]: [ids[j] for j in ups] for i, (_, ups) in enumerate(shape)}

        fleet = fleet_factory(ttl=TTL, hb=0.5, capacity=4, shutdown_timeout=1.0, poll=poll,
                              **worker)
        for _ in range(WORKERS):
            fleet.spawn()
        t0 = time.monotonic()
        deadline = t0 + 150
        next_kill = t0 + rnd.uniform(1.0, 2.5)
        kills = 0
        J = q._t.jobs

        async def rows(conn: Any) -> list[Any]:
            return list(await conn.execute(
                select(J.c.id, J.c.state, J.c.attempts, J.c.result).order_by(J.c.id)))

        while True:
            snapshot = await q._read(rows)
            done = sum(1 for r in snapshot if r.state == JobState.DONE)
            if done == n_jobs:
                break
            assert time.monotonic() < deadline, f"{done}/{n_jobs} done\n{fleet.dump()}"
            assert not any(r.state in (JobState.FAILED, JobState.CANCELLED) for r in snapshot)
            if time.monotonic() >= next_kill and done < n_jobs * 0.95:
                # a worker in the middle of an attempt where there is one: a kill that hits an
                # idle worker proves nothing about recovery (and a short run could end with
                # none interrupted)
                busy, ready = running_pids(fleet), {e["pid"] for e in fleet.events("ready")}
                alive = fleet.alive()
                victim = rnd.choice([p for p in alive if p.pid in busy]
                                    or [p for p in alive if p.pid in ready] or alive)
                fleet.kill(victim)
                kills += 1
                fleet.spawn()
                next_kill = time.monotonic() + rnd.uniform(1.0, 2.5)
            await asyncio.sleep(0.1)
        took = time.monotonic() - t0
        for p in fleet.alive():
            fleet.term(p)
        for p in fleet.procs:
            p.wait(timeout=30)

        events = fleet.events()
        jobs = {r.id: r for r in snapshot}
        ev = by_job(events)
        kill_t: dict[int, float] = {e["child"]: e["t"] for e in events if e["ev"] == "kill"}
        final_end: dict[int, float] = {}
        reruns = 0
        recover: list[float] = []
        problems: list[str] = []
        for jid, row in jobs.items():
            res = row.result
            if res["job"] != jid or res["attempt"] != row.attempts:
                problems.append(f"job {jid}: result {res} is not its final attempt's")
            fins = [e for e in ev[jid] if e["ev"] == "fin"]
            if len(fins) > 1 or any(f["attempt"] != row.attempts for f in fins):
                problems.append(f"job {jid}: finalize reported {fins}")
            if any(e["ev"] in ("discarded", "released", "cancelled") for e in ev[jid]):
                problems.append(f"job {jid}: {[e['ev'] for e in ev[jid]]}")
            starts = {e["attempt"]: e for e in ev[jid] if e["ev"] == "start"}
            ends = {e["attempt"]: e for e in ev[jid] if e["ev"] == "end"}
            if row.attempts not in ends:
                problems.append(f"job {jid}: no end event for its final attempt")
                continue
            final_end[jid] = ends[row.attempts]["t"]
            reruns += row.attempts - 1
            # an attempt that was not the last one must have lost its worker to a kill
            for a in range(1, row.attempts):
                s = starts.get(a)
                nxt = min((e["t"] for k, e in starts.items() if k > a), default=None)
                if s is None:  # claimed, then killed before the handler logged its start
                    if not any(t < (nxt or 1e20) for t in kill_t.values()):
                        problems.append(f"job {jid} attempt {a}: vanished without a kill")
                    continue
                k = kill_t.get(s["pid"])
                if k is None or k < s["t"] or (nxt is not None and k > nxt):
                    problems.append(f"job {jid} attempt {a} (pid {s['pid']}) re-ran without "
                                    f"its worker being killed (started {s['t']:.3f}, killed "
                                    f"{k}, next attempt {nxt})")
                elif nxt is not None:
                    recover.append(nxt - k)
        for jid, ups in deps.items():
            seen = jobs[jid].result["deps"]
            for u in ups:
                for s in (e for e in ev[jid] if e["ev"] == "start"):
                    if u in final_end and s["t"] <= final_end[u]:
                        problems.append(f"job {jid} attempt {s['attempt']} started before "
                                        f"its dependency {u} ended")
                if seen.get(str(u)) != [u, jobs[u].attempts]:
                    problems.append(f"job {jid} saw dependency {u} as {seen.get(str(u))}")
        assert not problems, "\n".join(problems[:30]) + "\n" + fleet.dump(20)
        assert kills >= 3, f"only {kills} kills: the run was too short to prove anything"
        assert reruns >= 1
        logs = fleet.worker_logs()
        assert "Traceback" not in logs, logs[-3000:]
        rec = (f"recover median {statistics.median(recover):.2f}s max {max(recover):.2f}s"
               if recover else "no interrupted attempt observed")
        print(f"\nCHAOS {db}: {n_jobs} jobs, {len(fleet.procs)} worker processes "
              f"({WORKERS} at a time), {kills} SIGKILLs, {reruns} re-runs, all done in "
              f"{took:.1f}s; time from kill to restart of an interrupted job: {rec} "
              f"(lease_ttl {TTL}s)")
        counts: dict[str, int] = defaultdict(int)
        for e in events:
            counts[e["ev"]] += 1
        print(f"CHAOS {db} events: {dict(counts)}")
        return events

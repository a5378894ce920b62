"""Many hosts on one database: worker "hosts" are Linux network namespaces made by the test.

Four namespaces on a bridge, each with its own address, run two worker processes
(tests/crashworker.py) each. They reach PostgreSQL or MariaDB over the bridge (a forwarder
on the bridge's address in front of the server, which listens on 127.0.0.1 only). Mid-run
one whole host is killed (SIGKILL to every process in its namespace) and another host's
link is cut (its veth down: packets dropped, connections hang as on a real partition),
then restored after its leases have expired. From the database and the timestamped event
log: nothing lost, no job finalized twice (the recorded result is its last attempt's and
at most one finalize per job was reported), the killed host's interrupted attempts were
re-run elsewhere, and the cut host's attempts that were in flight were reclaimed by other
hosts, so whatever the cut host finalized late changed nothing.

Needs root (``ip netns``); skipped elsewhere. Namespaces, links and the bridge are removed
whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from crashkit import WORKER, Fleet, by_job
from netkit import Forwarder, Net
from sqlalchemy import select
from sqlalchemy.engine import make_url

from aiojobqueue import JobQueue, JobState

HOSTS = 4
PER_HOST = 2
TTL = 3.0


@pytest.fixture
def net() -> Iterator[Net]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    n = Net(HOSTS)
    try:
        n.up()
    except subprocess.CalledProcessError as exc:
        n.down()
        pytest.skip(f"cannot make network namespaces here: {exc.stderr!r}")
    try:
        yield n
    finally:
        n.down()


class HostFleet(Fleet):
    """A Fleet whose workers run in the namespaces of ``net`` (spawn_on(host))."""

    def __init__(self, net: Net, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.net = net
        self.host_of: dict[int, int] = {}

    def spawn_on(self, host: int) -> subprocess.Popen[bytes]:
        """Fleet.spawn's worker, started inside the namespace (``ip netns exec`` execs it:
        the pid is the worker's)."""
        n = len(self.procs)
        err = open(self.tmp / f"worker{n}.log", "wb")  # noqa: SIM115 - lives with the process
        cmd = ["ip", "netns", "exec", self.net.ns[host], sys.executable, str(WORKER),
               self.url, self.prefix, str(self.log)]
        for k, v in self.opts.items():
            cmd += [f"--{k.replace('_', '-')}", str(v)]
        p = subprocess.Popen(cmd, stdout=err, stderr=subprocess.STDOUT)
        err.close()
        self.procs.append(p)
        self.note("spawn", child=p.pid, host=host)
        self.host_of[p.pid] = host
        return p


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("db", ["postgresql", "mariadb"])
async def test_four_hosts_kill_one_cut_another(
    db: str, db_url: str, net: Net, make_queue: Callable[..., JobQueue], prefix: str,
    tmp_path: Path,
) -> None:
    u = make_url(db_url)
    fwd = Forwarder(net.gateway, (u.host or "127.0.0.1", u.port or 5432)).start()
    remote = u.set(host=net.gateway, port=fwd.port).render_as_string(hide_password=False)
    rnd = random.Random(20261203)
    try:
        async with make_queue() as q:
            async with q.batch() as b:
                refs = [b.add("sleep", {"seconds": rnd.uniform(0.3, 0.9)}, max_attempts=20)
                        for _ in range(360)]
            ids = [r.id for r in refs]
            fleet = HostFleet(net, remote, prefix, tmp_path, ttl=TTL, hb=0.5, capacity=4,
                              shutdown_timeout=1.0, poll=0.1)
            try:
                for h in range(HOSTS):
                    for _ in range(PER_HOST):
                        fleet.spawn_on(h)
                for p in fleet.procs:
                    await fleet.ready(p, timeout=60)
                J = q._t.jobs

                async def states() -> dict[str, int]:
                    rows = await q._read(lambda c: c.execute(select(J.c.state)))
                    out: dict[str, int] = {}
                    for (s,) in rows:
                        out[s] = out.get(s, 0) + 1
                    return out

                async def until_done(n: int, limit: float) -> None:
                    deadline = time.monotonic() + limit
                    while (await states()).get(JobState.DONE, 0) < n:
                        assert time.monotonic() < deadline, fleet.dump()
                        await asyncio.sleep(0.1)

                await until_done(60, 60)
                killed = net.kill_host(0)
                fleet.note("host_killed", host=0, pids=killed)
                await until_done(120, 60)
                net.cut(1)
                cut_at = time.time()
                fleet.note("host_cut", host=1)
                await asyncio.sleep(TTL * 2.5)  # its leases expire; the others reclaim them
                net.heal(1)
                healed_at = time.time()
                fleet.note("host_healed", host=1)
                await until_done(len(ids), 120)
                await asyncio.sleep(1.0)  # late reports of the healed host land in the log
                snapshot = {r.id: r for r in await q._read(lambda c: c.execute(
                    select(J.c.id, J.c.state, J.c.attempts, J.c.result)))}
            finally:
                for p in fleet.alive():
                    fleet.term(p)
                for p in fleet.procs:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        p.wait(timeout=20)
                fleet.close()
    finally:
        fwd.stop()

    events = fleet.events()
    ev = by_job(events)
    host = {p: h for p, h in fleet.host_of.items()}
    problems: list[str] = []
    for jid in ids:
        row = snapshot[jid]
        if row.state != JobState.DONE:
            problems.append(f"job {jid} is {row.state}")
            continue
        fins = [e for e in ev[jid] if e["ev"] == "fin"]
        if len(fins) > 1 or any(f["attempt"] != row.attempts for f in fins):
            problems.append(f"job {jid}: finalize reported {fins}")
        if row.result["attempt"] != row.attempts:
            problems.append(f"job {jid}: result {row.result} is not attempt {row.attempts}'s")
    assert not problems, "\n".join(problems[:20]) + "\n" + fleet.dump(30)

    def in_flight(h: int, at: float) -> list[tuple[int, int]]:
        """(job, attempt) started on host ``h`` before ``at`` and not ended before it."""
        out = []
        for jid in ids:
            for s in (e for e in ev[jid] if e["ev"] == "start" and host.get(e["pid"]) == h):
                ended = any(e["ev"] == "end" and e["attempt"] == s["attempt"] and e["t"] < at
                            for e in ev[jid])
                if s["t"] < at and not ended:
                    out.append((jid, s["attempt"]))
        return out

    kill_t = next(e["t"] for e in events if e["ev"] == "host_killed")
    lost_to_kill = in_flight(0, kill_t)
    assert lost_to_kill, "the kill hit an idle host: it proves nothing"
    for jid, a in lost_to_kill:  # re-run elsewhere, the re-run's outcome recorded
        assert snapshot[jid].attempts > a and host.get(snapshot[jid].result["pid"]) != 0
    cut_off = in_flight(1, cut_at)
    assert cut_off, "nothing was running on the cut host"
    reclaimed = [(j, a) for j, a in cut_off if snapshot[j].attempts > a]
    assert reclaimed, "no lease of the cut host expired and was taken over"
    for jid, a in reclaimed:  # the stale attempt's outcome never landed
        assert snapshot[jid].result["attempt"] != a
    late = [e for e in events if host.get(e.get("pid", -1)) == 1 and e["t"] >= healed_at
            and e["ev"] in ("fin", "discarded", "released")]
    stale_fins = [e for e in late if e["ev"] == "fin" and (e["job"], e["attempt"]) in reclaimed]
    assert not stale_fins, stale_fins
    after = [e for e in events if e["ev"] == "fin" and host.get(e["pid"]) == 1
             and e["t"] > healed_at]
    print(f"\nHOSTS {db}: {HOSTS}x{PER_HOST} workers, {len(ids)} jobs; killed host 0 with "
          f"{len(lost_to_kill)} attempts in flight (re-run elsewhere); cut host 1 with "
          f"{len(cut_off)} in flight, {len(reclaimed)} reclaimed by other hosts; after the "
          f"link came back host 1 reported {sum(e['ev'] == 'discarded' for e in late)} "
          f"fenced-out finalizes and finished {len(after)} new jobs")

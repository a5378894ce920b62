"""PostgreSQL's own CPU per job over a drain: two trees alternated, or the v7 indexes kept
against dropped.

    PYTHONPATH=$PWD /work/venv/bin/python bench/pg_server_cpu.py --trees /tmp/ajq-old,$PWD \\
        [--shape flat|dag] [--n 10000] [--conc 50] [--reps 5] [--drop-overview]

Each drain runs in a fresh process importing ``aiojobqueue`` from its tree: a fresh table
prefix, ``--n`` no-op jobs (``flat`` in batches of 1,000, or bench/obs_ab.py's 20-layer
DAG), ``ANALYZE``, then one worker at capacity ``--conc`` drains them. The CPU time of
every ``postgres`` process on this machine (from /proc, clock ticks: about 1 us per job at
10,000 jobs) is read around ``run_until_idle()`` alone. ``--drop-overview`` runs each tree
twice per round, with schema v7's partial indexes (``ix_waiting_group`` and the others) and
without. Prints one line per drain, then the medians. Needs a server on this machine
(``AIOJOBQUEUE_TEST_PG``, default postgres@127.0.0.1:5432/test) and little else running.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

URL = os.environ.get("AIOJOBQUEUE_TEST_PG", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
HERE = os.path.dirname(os.path.abspath(__file__))


def server_cpu() -> float:
    """Seconds of CPU used so far by the postgres processes on this machine."""
    ticks = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if stat[stat.index("(") + 1:stat.rindex(")")].startswith("postgres"):
            fields = stat[stat.rindex(")") + 2:].split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


async def child(shape: str, n: int, conc: int, drop: bool) -> tuple[float, float]:
    """(jobs/s, server CPU us per job) of one drain."""
    from sqlalchemy import text

    from aiojobqueue import JobQueue

    spec = importlib.util.spec_from_file_location("obs_ab", os.path.join(HERE, "obs_ab.py"))
    assert spec is not None and spec.loader is not None
    obs: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(obs)
    p = f"sc{uuid.uuid4().hex[:6]}_"
    q = JobQueue(URL, prefix=p, capacity=conc)

    @q.handler("noop")
    async def noop(ctx: Any) -> None:
        pass

    async with q:
        try:
            if drop:
                async with q.engine.begin() as conn:
                    for state in ("waiting", "scheduled", "failed"):
                        await conn.execute(text(f"DROP INDEX IF EXISTS {p}ix_{state}_group"))
            total = await obs.build(q, n, shape == "dag")
            async with q.engine.begin() as conn:
                await conn.execute(text(f"ANALYZE {p}jobs"))
            c0, t0 = server_cpu(), time.perf_counter()
            await q.run_until_idle()
            c1, t1 = server_cpu(), time.perf_counter()
        finally:
            async with q.engine.begin() as conn:
                await conn.run_sync(q._t.metadata.drop_all)
    return total / (t1 - t0), (c1 - c0) / total * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", default=os.path.dirname(HERE))
    ap.add_argument("--shape", default="flat", choices=("flat", "dag"))
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--conc", type=int, default=50)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--drop-overview", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--drop", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        rate, cpu = asyncio.run(child(a.shape, a.n, a.conc, a.drop))
        print(rate, cpu)
        return
    variants = [(t, d) for t in a.trees.split(",") for d in
                ((False, True) if a.drop_overview else (False,))]
    got: dict[tuple[str, bool], list[tuple[float, float]]] = {v: [] for v in variants}
    for r in range(a.reps):
        for tree, drop in variants[r % len(variants):] + variants[:r % len(variants)]:
            cmd = [sys.executable, __file__, "--child", "--shape", a.shape, "--n", str(a.n),
                   "--conc", str(a.conc)] + (["--drop"] if drop else [])
            out = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": tree},
                                 capture_output=True, text=True, timeout=900, check=True)
            rate, cpu = map(float, out.stdout.split()[-2:])
            got[(tree, drop)].append((rate, cpu))
            print(f"round {r + 1} {tree} {'dropped' if drop else 'v7'}: {rate:,.0f}/s "
                  f"{cpu:.1f} us/job (load {os.getloadavg()[0]:.1f})", flush=True)
    print(f"\n{a.shape} drain, {a.n} jobs, C={a.conc}, {a.reps} rounds: medians")
    print("| tree | indexes | jobs/s | server CPU us/job |\n|---|---|---:|---:|")
    for (tree, drop), rows in got.items():
        print(f"| {tree} | {'dropped' if drop else 'v7'} | "
              f"{statistics.median(x[0] for x in rows):,.0f} | "
              f"{statistics.median(x[1] for x in rows):.1f} |")


if __name__ == "__main__":
    main()

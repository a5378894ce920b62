"""Where the DAG drain's gap to the flat drain comes from (PostgreSQL), one command:

    PYTHONPATH=$PWD /tmp/peers-venv/bin/python bench/dag_decompose.py [--reps 3]

Per C (10, 50), alternated triples of drains of N=20,000 no-op jobs by one worker:

* ``flat``: independent jobs;
* ``pre-released``: bench/run.py's 20-layer DAG (containers holding a head, 998 fan-out jobs
  and a fan-in) with every job made ready up front in SQL: containers active, the fan-outs'
  edges to their head removed, the fan-ins still counting their 998 edges. It keeps the
  parents, the dependents, the one-call finalize path and the fan-in counters, but has no
  release writes and no layer boundaries;
* ``dag``: the real DAG.

Rates, the ratio to the flat median, and CPU per job in this process and in the local
PostgreSQL server (see run.py). An experiment, not a supported way to run a DAG: the SQL
rewrites the queue's tables behind its back.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys

import run as R  # bench/run.py (its sys.path set-up makes the peer harness importable)

DB = "bench_ajq_decompose"
PRE_RELEASE = """
UPDATE ajq_jobs SET state = 'active', pending = 0 WHERE kind = 'container';
UPDATE ajq_jobs j SET state = 'ready', pending = 0
  WHERE kind = 'job' AND state = 'waiting'
    AND (SELECT count(*) FROM ajq_deps d WHERE d.job_id = j.id) <= 1;
DELETE FROM ajq_deps d USING ajq_jobs j WHERE d.job_id = j.id AND j.state = 'ready';
UPDATE ajq_jobs SET pending = 0 WHERE state = 'waiting' AND pending >= 1073741824;
UPDATE ajq_jobs j SET pending = (SELECT count(*) FROM ajq_deps d WHERE d.job_id = j.id)
  WHERE state = 'waiting';
UPDATE ajq_jobs SET has_dependents = false
  WHERE has_dependents AND id NOT IN (SELECT depends_on_id FROM ajq_deps);
"""


async def dag(conc: int, n: int, pre: bool) -> float:
    import asyncpg

    dsn, jobs = await R.loaded(DB, n, True)
    if pre:
        conn = await asyncpg.connect(dsn.replace("postgresql+asyncpg", "postgresql"))
        try:
            await conn.execute(PRE_RELEASE)
            # the rewrite's dead row versions gone: the real DAG starts without any either
            await conn.execute("VACUUM ajq_jobs")
        finally:
            await conn.close()
    span, v = await R.drain_aiojobqueue(dsn, conc, cpu=f"{'pre' if pre else 'dag'} C={conc}")
    for k in ("completed", "distinct"):  # the containers are done too, never run
        v[k] -= 20
    ok = R.check(v, jobs)
    if ok != "ok":
        sys.exit(ok)
    return jobs / span


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n", type=int, default=20000)
    args = ap.parse_args()
    print("| C | drain | jobs/s (median) | vs flat | CPU per job |")
    print("|---|---|---|---|---|")
    for conc in (10, 50):
        rates: dict[str, list[float]] = {"flat": [], "pre": [], "dag": []}
        for _ in range(args.reps):
            rates["flat"].append((await R.flat(conc, args.n, cpu=f"flat C={conc}"))[0])
            rates["pre"].append(await dag(conc, args.n, pre=True))
            rates["dag"].append(await dag(conc, args.n, pre=False))
        flat = statistics.median(rates["flat"])
        for key, name in (("flat", "flat"), ("pre", "pre-released DAG"), ("dag", "DAG")):
            r = statistics.median(rates[key])
            print(f"| {conc} | {name} | {r:,.0f}/s | {r / flat:.2f} | "
                  f"{R.cpu_note(f'{key} C={conc}')} |", flush=True)


if __name__ == "__main__":
    asyncio.run(main())

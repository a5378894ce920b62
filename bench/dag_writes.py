"""What PostgreSQL does per drain, in counters that do not drift with the machine's speed:

    PYTHONPATH=$PWD /tmp/peers-venv/bin/python bench/dag_writes.py [--conc 50] [--reps 2]

Alternated drains of N=20,000 no-op jobs by one worker (``flat``, then bench/run.py's
20-layer DAG), each on a fresh database. Per drain: jobs/s, row updates of the jobs table
(and how many were HOT), WAL bytes, commits, the one-call routine's calls and time in the
server (``track_functions = 'pl'`` set on the database), and CPU per job in this process
and in the local server (see run.py). Rates on this 2-core machine drift by up to 2x within
minutes; these counters do not, so a change meant to save work in the server shows here
first.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import run as R  # bench/run.py (its sys.path set-up makes the peer harness importable)

DB = "bench_ajq_writes"

COUNTERS = """
SELECT (SELECT n_tup_upd FROM pg_stat_user_tables WHERE relname = 'ajq_jobs') AS upd,
       (SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'ajq_jobs') AS hot,
       (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()) AS xacts,
       pg_current_wal_lsn() AS lsn,
       (SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions
         WHERE funcname LIKE 'ajq_jobs_settle_%') AS calls,
       (SELECT coalesce(sum(total_time), 0) FROM pg_stat_user_functions
         WHERE funcname LIKE 'ajq_jobs_settle_%') AS ms
"""


async def counters(conn: Any) -> dict[str, Any]:
    await asyncio.sleep(0.6)  # the statistics collector reports every 500 ms
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    return dict(await conn.fetchrow(COUNTERS))


async def drain(conc: int, n: int, dag: bool, rep: int) -> str:
    import asyncpg

    dsn, jobs = await R.loaded(DB, n, dag)
    plain = dsn.replace("postgresql+asyncpg", "postgresql")
    conn = await asyncpg.connect(plain)
    try:
        # for the drain's sessions (all opened after this)
        await conn.execute(f"ALTER DATABASE {DB} SET track_functions = 'pl'")
        before = await counters(conn)
        label = f"{'dag' if dag else 'flat'} C={conc} #{rep}"
        span, _ = await R.drain_aiojobqueue(dsn, conc, cpu=label)
        after = await counters(conn)
        wal = float(await conn.fetchval("SELECT pg_wal_lsn_diff($1, $2)",
                                        after["lsn"], before["lsn"]))
    finally:
        await conn.close()
    d = {k: after[k] - before[k] for k in ("upd", "hot", "xacts", "calls", "ms")}
    return (f"| {conc} | {'DAG' if dag else 'flat'} | {jobs / span:,.0f}/s | {d['upd']:,} "
            f"({d['hot']} HOT) | {wal / 1e6:.1f} MB | {d['xacts']:,} | {d['calls']} calls, "
            f"{float(d['ms']):.0f} ms | {R.cpu_note(label)} |")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conc", type=int, default=50)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--n", type=int, default=20000)
    args = ap.parse_args()
    print("| C | drain | jobs/s | row updates | WAL | commits | routine | CPU per job |")
    print("|---|---|---|---|---|---|---|---|")
    for rep in range(args.reps):
        for dag in (False, True):
            print(await drain(args.conc, args.n, dag, rep), flush=True)


if __name__ == "__main__":
    asyncio.run(main())

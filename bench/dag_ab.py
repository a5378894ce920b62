"""A/B of two code trees on the DAG (PostgreSQL), alternated, one command:

    git worktree add --detach /tmp/old <rev>        # the code to compare against
    PYTHONPATH=$PWD /tmp/peers-venv/bin/python bench/dag_ab.py --old /tmp/old [--pairs 10]

Each pair runs the same measurement once on ``--old`` and once on this checkout, in fresh
processes (so each imports its own ``aiojobqueue``), on a fresh database each time; the pairs
alternate which goes first. Reported: every value, the medians, the median of the per-pair
ratios (new / old) and how many pairs the new code won. Measurements (``--what``):

* ``drain``: bench/run.py's 20-layer DAG of 20,000 no-op jobs drained by one worker at
  ``--conc`` (jobs/s; higher is better). No DAG/flat ratio here: this machine's speed
  drifts too much between minutes for one to show a few per cent; pairs of the same
  workload do.
* ``flat``: the same 20,000 jobs without edges or containers (bench/run.py's flat drain), to
  see what a change to the worker does to the flat rate.
* ``fanout``: one head job and ``--wide`` jobs depending on it, capacity ``--conc``: ms from
  the head's end to the first dependent's start (lower is better).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DB = "bench_ajq_ab"


async def drain(conc: int, dag: bool = True) -> float:
    import run as R

    dsn, n = await R.loaded(DB, 20000, dag=dag)
    span, v = await R.drain_aiojobqueue(dsn, conc)
    for k in ("completed", "distinct") if dag else ():  # the containers: done, never run
        v[k] -= 20
    if R.check(v, n) != "ok":
        raise SystemExit(f"drain failed its check: {v}")
    return n / span


async def fanout(conc: int, wide: int) -> float:
    import run  # noqa: F401 - its sys.path set-up makes the peer harness importable
    from common import fresh_db

    from aiojobqueue import JobContext, JobQueue

    dsn = await fresh_db(DB)
    q = JobQueue(dsn.replace("postgresql://", "postgresql+asyncpg://"), capacity=conc)
    marks: dict[str, float] = {}

    @q.handler("t")
    async def t(ctx: JobContext, head: bool) -> None:
        marks.setdefault("head" if head else "first", time.perf_counter())

    async with q:
        async with q.batch() as b:
            first = b.add("t", {"head": True})
            for _ in range(wide):
                b.add("t", {"head": False}, depends_on=[first])
        await q.run_until_idle()
    return (marks["first"] - marks["head"]) * 1e3


def one(tree: str, args: argparse.Namespace) -> float:
    """One measurement in a fresh process importing aiojobqueue from ``tree``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tree, HERE])}
    cmd = [sys.executable, __file__, "--child", "--what", args.what, "--conc", str(args.conc),
           "--wide", str(args.wide)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise SystemExit(f"{tree}: {out.stderr[-2000:]}")
    return float(out.stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", help="the code tree to compare this checkout against")
    ap.add_argument("--what", choices=("drain", "flat", "fanout"), default="drain")
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--conc", type=int, default=50)
    ap.add_argument("--wide", type=int, default=10000)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        got = asyncio.run(fanout(args.conc, args.wide) if args.what == "fanout"
                          else drain(args.conc, dag=args.what == "drain"))
        print(f"{got:.3f}")
        return
    if not args.old:
        ap.error("--old is required")
    old: list[float] = []
    new: list[float] = []
    for i in range(args.pairs):
        order = [(args.old, old), (ROOT, new)]
        for tree, into in order if i % 2 == 0 else order[::-1]:
            into.append(one(tree, args))
        print(f"  pair {i + 1}: old {old[-1]:,.1f}  new {new[-1]:,.1f}", flush=True)
    unit, better = ("ms", min) if args.what == "fanout" else ("jobs/s", max)
    ratios = [n / o for o, n in zip(old, new, strict=True)]
    wins = sum(better(o, n) == n and n != o for o, n in zip(old, new, strict=True))
    what = {"drain": f"20-layer DAG drain, C={args.conc}",
            "flat": f"flat drain of 20,000, C={args.conc}",
            "fanout": f"head end -> first of {args.wide:,} dependents starts, C={args.conc}",
            }[args.what]
    print(f"\n| {what} | old | new | new / old (median of pairs) | new better |")
    print("|---|---|---|---|---|")
    print(f"| median {unit} | {statistics.median(old):,.1f} | {statistics.median(new):,.1f} | "
          f"{statistics.median(ratios):.3f} | {wins} of {args.pairs} |")


if __name__ == "__main__":
    main()

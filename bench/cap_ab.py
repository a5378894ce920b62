"""Caps without the cliff and slot turnover (issue 18, targets 3 and 4), A/B between two
code trees in the same run.

    PYTHONPATH=$PWD /work/venv/bin/python bench/cap_ab.py --old /tmp/ajq-old
        [--new .] [--dbs postgresql,sqlite,mariadb] [--caps 10,50] [--reps 3] [--n 5000]
        [--turn-jobs 480] [--only cap,turnover]

``cap``: one worker process (``run_until_idle()``, no-op handlers, ``capacity=C``) drains N
jobs in one group, enqueued beforehand on a fresh table prefix (bench/fairshare.py's
``drain``, checked: N jobs done), three ways: uncapped, with a global ``concurrency=C``,
and with ``group_limits`` capping the group at C. Per database and C, the trees alternate
A B A B, and within each tree's turn the three drains alternate too (rotated rep by rep),
so each ratio compares the same minutes. ``turnover``: bench/fairshare.py's ``turnover``
(3 worker processes sharing ``concurrency=8``, 50 ms jobs, interval logs), trees
alternated. Each drain runs in a child process with ``PYTHONPATH`` set to its tree.
Prints one table: per database, C and tree, the median capped / uncapped ratio (per-rep
ratios in brackets), the median rates, and round trips per job (statements, BEGINs and
COMMITs a drain sends, counted in one more drain per tree, variant and C, kept out of the
timed ones: a figure the machine's load does not move); then the turnover rows (busy share of
the 8 slots, end-to-next-start p50 / p99, most seen running at once).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from abtree import run_in_tree

VARIANTS = ("uncapped", "concurrency", "group_limits", "default_cap", "group_rate")
#: variants of the stored policy (issue 31): measured in the new tree only
NEW_ONLY = ("default_cap", "group_rate")


def child(tree: str, kind: str, db: str, n: int, c: int) -> dict[str, Any]:
    """One measurement with the aiojobqueue (and bench/fairshare.py) of ``tree``."""
    sys.path.insert(0, str(Path(tree) / "bench"))
    import fairshare as F

    import aiojobqueue

    tmp = tempfile.mkdtemp()
    if kind == "turnover":
        sys.path.insert(0, str(Path(tree) / "tests"))
        import schedtools as T

        read = T.read_log

        def read_log(log: Path) -> list[dict[str, Any]]:
            # the bench polls the log while workers append to it: a line may be half
            # written (then it is read again at the next poll)
            while True:
                try:
                    return read(log)
                except json.JSONDecodeError:
                    continue

        T.read_log = read_log
        busy, med, p99, peak = F.turnover(db, tmp, n, conc=c)
        return {"busy": busy, "p50": med, "p99": p99, "peak": peak,
                "tree": aiojobqueue.__file__}
    counted: list[int] | None = None
    if kind.endswith(":count"):
        kind = kind.removesuffix(":count")
        counted = count_trips()
    opts: dict[str, Any] = {"capacity": c}
    if kind == "concurrency":
        opts["concurrency"] = c
    elif kind == "group_limits":
        opts["group_cap"] = c
    elif kind == "default_cap":
        opts["default_cap"] = c
    elif kind == "group_rate":  # never binds: its cost is counting it at every claim
        opts["group_rate"] = 10**6
    rate = asyncio.run(F.drain(db, tmp, n, 1, **opts))
    trips = None if counted is None else counted[0] / n
    return {"rate": rate, "trips": trips, "tree": aiojobqueue.__file__}


def count_trips() -> list[int]:
    """Counts, from here on, what every queue's drain sends: each statement, BEGIN and
    COMMIT (an executemany counts one), in [0]."""
    from sqlalchemy import event

    from aiojobqueue import JobQueue

    seen = [0]
    run = JobQueue.run_until_idle

    def bump(*_: Any) -> None:
        seen[0] += 1

    async def counting(self: JobQueue) -> None:
        engine = self.engine.sync_engine
        for name in ("before_cursor_execute", "begin", "commit"):
            event.listen(engine, name, bump)
        try:
            await run(self)
        finally:
            for name in ("before_cursor_execute", "begin", "commit"):
                event.remove(engine, name, bump)

    JobQueue.run_until_idle = counting  # type: ignore[method-assign]
    return seen


def run(tree: str, kind: str, db: str, n: int, c: int) -> dict[str, Any]:
    return run_in_tree(__file__, tree, [tree, kind, db, str(n), str(c)], f"{kind} {db} C={c}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--old")
    p.add_argument("--new", default=".")
    p.add_argument("--dbs", default="postgresql,sqlite,mariadb")
    p.add_argument("--caps", default="10,50")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--n", type=int, default=5000)
    p.add_argument("--turn-jobs", type=int, default=480)
    p.add_argument("--only", default="cap,turnover")
    p.add_argument("--child", nargs=5, default=None)
    a = p.parse_args()
    if a.child:
        tree, kind, db, n, c = a.child
        print(json.dumps(child(tree, kind, db, int(n), int(c))))
        return
    if not a.old:
        p.error("--old is required")
    trees = {"old": str(Path(a.old).resolve()), "new": str(Path(a.new).resolve())}
    only = set(a.only.split(","))
    print(f"# N={a.n}, reps={a.reps}, load avg {os.getloadavg()[0]:.1f}; old={trees['old']}")
    print("| db | workload | tree | result | vs uncapped (per rep) |")
    print("|---|---|---|---|---|")
    for db in a.dbs.split(","):
        for c in (int(x) for x in a.caps.split(",")) if "cap" in only else ():
            got: dict[tuple[str, str], list[float]] = {}
            for rep in range(a.reps):
                for name in ("old", "new") if rep % 2 == 0 else ("new", "old"):
                    vs = [v for v in VARIANTS if name == "new" or v not in NEW_ONLY]
                    order = vs[rep % len(vs):] + vs[:rep % len(vs)]
                    for v in order:
                        r = run(trees[name], v, db, a.n, c)["rate"]
                        got.setdefault((name, v), []).append(r)
            trips = {(name, v): run(trees[name], v + ":count", db, a.n, c)["trips"]
                     for name in ("old", "new") for v in VARIANTS
                     if name == "new" or v not in NEW_ONLY}
            for name in ("old", "new"):
                unc = got[name, "uncapped"]
                print(f"| {db} | C={c} uncapped | {name} | {statistics.median(unc):,.0f} "
                      f"jobs/s; {trips[name, 'uncapped']:.2f} trips/job | |", flush=True)
                for v in VARIANTS[1:]:
                    if (name, v) not in got:
                        continue
                    ratios = [x / y for x, y in zip(got[name, v], unc, strict=True)]
                    print(f"| {db} | C={c} {v}={c} | {name} | "
                          f"{statistics.median(got[name, v]):,.0f} jobs/s; "
                          f"{trips[name, v]:.2f} trips/job | "
                          f"**{statistics.median(ratios):.2f}** "
                          f"[{', '.join(f'{x:.2f}' for x in ratios)}] |", flush=True)
        if "turnover" in only:
            turns: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
            for rep in range(a.reps):
                for name in ("old", "new") if rep % 2 == 0 else ("new", "old"):
                    turns[name].append(run(trees[name], "turnover", db, a.turn_jobs, 8))
            for name in ("old", "new"):
                t = turns[name]

                def med(k: str, t: list[dict[str, Any]] = t) -> float:
                    return statistics.median(x[k] for x in t)

                print(f"| {db} | turnover {a.turn_jobs} x 50 ms, concurrency=8, 3 procs | "
                      f"{name} | busy {med('busy'):.1%} "
                      f"[{', '.join(format(x['busy'], '.1%') for x in t)}] | end-to-next-start "
                      f"p50 {med('p50'):.1f} ms, p99 {med('p99'):.1f} ms; max running "
                      f"{max(x['peak'] for x in t)} |", flush=True)


if __name__ == "__main__":
    main()

"""Many tenants and stale groups (issue 18, targets 1 and 2), A/B between two code trees
in the same run.

    PYTHONPATH=$PWD /work/venv/bin/python bench/groups_ab.py --old /tmp/ajq-old
        [--new .] [--dbs postgresql,sqlite,mariadb] [--groups 1,10,100,1000,10000]
        [--n 20000] [--stale 100000] [--reps 2] [--only groups,stale]

Each drain is bench/fairshare.py's ``drain`` (one worker process, ``capacity=10``, no-op
handlers, N jobs enqueued beforehand on a fresh table prefix, checked: N jobs done), run in
a child process with ``PYTHONPATH`` set to its tree. ``groups``: N jobs round-robin over G
groups; ``stale``: N jobs in 10 groups, fresh and after ``--stale`` other groups once had
a job each (finished; on PostgreSQL vacuumed). Per database and rep the trees alternate,
and the rows within a tree's turn too (reversed every other rep), so each ratio compares
the same minutes. Prints per database and tree the median rate of each row and its ratio
to the tree's one-group (or fresh) drain, per-rep ratios in brackets.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from abtree import run_in_tree


def child(tree: str, db: str, n: int, groups: int, stale: int) -> dict[str, Any]:
    """One drain with the aiojobqueue (and bench/fairshare.py) of ``tree``."""
    import asyncio

    sys.path.insert(0, str(Path(tree) / "bench"))
    import fairshare as F

    import aiojobqueue

    rate = asyncio.run(F.drain(db, tempfile.mkdtemp(), n, groups, stale=stale))
    return {"rate": rate, "tree": aiojobqueue.__file__}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--old")
    p.add_argument("--new", default=".")
    p.add_argument("--dbs", default="postgresql,sqlite,mariadb")
    p.add_argument("--groups", default="1,10,100,1000,10000")
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--stale", type=int, default=100000)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--only", default="groups,stale")
    p.add_argument("--child", nargs=5, metavar=("TREE", "DB", "N", "G", "STALE"))
    a = p.parse_args()
    if a.child:
        import json

        tree, db, n, g, s = a.child
        print(json.dumps(child(tree, db, int(n), int(g), int(s))))
        return
    only = set(a.only.split(","))
    rows: list[tuple[str, int, int]] = []  # (name, groups, stale)
    if "groups" in only:
        rows += [(f"groups={g}", int(g), 0) for g in a.groups.split(",")]
    if "stale" in only:
        rows += [("fresh 10 groups", 10, 0), (f"10 groups after {a.stale} stale", 10, a.stale)]
    base = {r[0]: ("groups=" + a.groups.split(",")[0] if r[0].startswith("groups")
                   else "fresh 10 groups") for r in rows}
    trees = {"old": str(Path(a.old).resolve()), "new": str(Path(a.new).resolve())}
    script = str(Path(__file__).resolve())
    print(f"# N={a.n}, reps={a.reps}, load avg {os.getloadavg()[0]:.1f}", flush=True)
    for db in a.dbs.split(","):
        got: dict[tuple[str, str], list[float]] = {}
        for rep in range(a.reps):
            order = list(trees.items()) if rep % 2 == 0 else list(trees.items())[::-1]
            for name, tree in order:
                seq = rows if rep % 2 == 0 else rows[::-1]
                for label, g, s in seq:
                    res = run_in_tree(script, tree, [tree, db, str(a.n), str(g), str(s)],
                                      f"{db} {label}")
                    got.setdefault((name, label), []).append(res["rate"])
        print(f"\n## {db} (load avg {os.getloadavg()[0]:.1f})")
        print("| row | tree | jobs/s | vs | ratio [per rep] |")
        print("|---|---|---|---|---|")
        for label, _, _ in rows:
            for name in trees:
                v, b = got[(name, label)], got[(name, base[label])]
                per = [x / y for x, y in zip(v, b, strict=True)]
                print(f"| {label} | {name} | {statistics.median(v):,.0f} | {base[label]} | "
                      f"**{statistics.median(per):.2f}** "
                      f"[{', '.join(f'{r:.2f}' for r in per)}] |", flush=True)


if __name__ == "__main__":
    main()

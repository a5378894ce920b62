"""Does an optimisation path pay? This checkout against itself with only that path switched off.

    .venv/bin/python bench/paths_ab.py routine [--pairs 6] [--reps 3]
    .venv/bin/python bench/paths_ab.py --list

For the named path, a scratch worktree of this checkout's HEAD gets one edit that switches
the path off (the same behaviour by the general path, more round trips), then the path's
A/B benchmarks run with ``--old`` that worktree: bench/dag_ab.py (PostgreSQL, alternated
pairs, median of the per-pair ratios) or bench/cap_ab.py (per database, alternated reps).
"new" is this checkout with the path, "old" the same code without it. Run it on a clean
checkout (uncommitted changes are in "new" only) and a quiet machine. An edit that no
longer applies fails loudly: the source moved, so this table has to follow it.
docs/performance.md lists what each path bought when last measured.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


@dataclass(frozen=True)
class Path:
    """One path: the edit that switches it off and the benchmarks that show what it buys."""

    what: str
    file: str
    old: str
    new: str
    runs: tuple[tuple[str, ...], ...]


DAG = ("dag_ab.py", "--what", "drain")
PATHS = {
    "routine": Path(
        "PostgreSQL's one-call finalize routine (RoutineRound, finish.sql, split.sql) against "
        "the autocommit round's statements",
        "aiojobqueue/dialects/postgresql/__init__.py",
        'return "routine" if routines else "autocommit"', 'return "autocommit"',
        ((*DAG, "--conc", "50"), (*DAG, "--conc", "10"))),
    "fast": Path(
        "PostgreSQL: successes of jobs nothing waits on by one fenced UPDATE (finish_fast) "
        "against the routine's call",
        "aiojobqueue/worker/rounds.py",
        '        alone = self.state.alone\n        return [o for o in batch if o.kind == "done" '
        'and o.result is None\n                and alone(o.job_id, o.attempt)]',
        "        return []",
        (("dag_ab.py", "--what", "flat", "--conc", "50"),
         ("dag_ab.py", "--what", "flat", "--conc", "10"))),
    "counted": Path(
        "MySQL/MariaDB: a round of independent successes by one counted UPDATE "
        "(finish_counted) against the locking finalize",
        "aiojobqueue/worker/rounds.py",
        "        return (bool(batch) and not fin.settler.path.returns_rows",
        "        return False and (bool(batch) and not fin.settler.path.returns_rows",
        (("cap_ab.py", "--dbs", "mariadb", "--caps", "10,50", "--only", "cap"),)),
    "handover": Path(
        "under a counted cap, a round's claim takes over the slots its own finalize freed "
        "without the gate (slots.py, Slots._handover; the held jobs it leases ahead too) "
        "against the claim under the gate",
        "aiojobqueue/slots.py",
        "                or self.c.single_group is None or self.handover_stale(now, quick)):",
        "                or True):",
        (("cap_ab.py", "--dbs", "postgresql,sqlite,mariadb", "--caps", "10,50"),)),
    "split": Path(
        "PostgreSQL: the split release of a wide fan-out (fanout.SPLIT) against releasing "
        "every dependent in the finalize's call",
        "aiojobqueue/fanout.py", "\nSPLIT = 128\n", "\nSPLIT = 10**9\n",
        (("dag_ab.py", "--what", "fanout"), (*DAG, "--conc", "50"))),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", nargs="?", choices=sorted(PATHS))
    ap.add_argument("--list", action="store_true", help="the paths and what each replaces")
    ap.add_argument("--pairs", type=int, default=6, help="dag_ab.py's alternated pairs")
    ap.add_argument("--reps", type=int, default=3, help="cap_ab.py's reps")
    a = ap.parse_args()
    if a.list or a.path is None:
        for name, p in sorted(PATHS.items()):
            print(f"{name:8} {p.what}")
        return
    p = PATHS[a.path]
    with tempfile.TemporaryDirectory(prefix=f"ajq-no-{a.path}-") as tmp:
        off = os.path.join(tmp, "tree")
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", off, "HEAD"],
                       check=True, capture_output=True)
        try:
            target = os.path.join(off, p.file)
            with open(target) as f:
                text = f.read()
            if text.count(p.old) != 1:
                raise SystemExit(f"{a.path}: the switch no longer applies to {p.file}; "
                                 "update PATHS in bench/paths_ab.py")
            with open(target, "w") as f:
                f.write(text.replace(p.old, p.new))
            print(f"# {a.path}: {p.what}\n# new = this checkout, old = without the path")
            for run in p.runs:
                extra = ["--pairs", str(a.pairs)] if run[0] == "dag_ab.py" else [
                    "--reps", str(a.reps)]
                cmd = [sys.executable, os.path.join(HERE, run[0]), "--old", off, *run[1:],
                       *extra]
                print(f"\n$ {' '.join(run)} {' '.join(extra)}", flush=True)
                subprocess.run(cmd, check=True, cwd=ROOT)
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", off],
                           check=False, capture_output=True)


if __name__ == "__main__":
    main()

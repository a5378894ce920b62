"""Where a DAG drain's wall time goes, round by round (PostgreSQL), one command:

    PYTHONPATH=$PWD /tmp/peers-venv/bin/python bench/dag_timeline.py [--conc 50] [--reps 2]

Alternated drains of N=20,000 no-op jobs by one worker (``flat``, then bench/run.py's
20-layer DAG), each on a fresh database, with every round of the worker's pump (and of its
flusher) timed: Worker._flush is wrapped for the run. A round is one of

* ``step``: outcomes written and jobs leased by the one call that released them, with no
  backlog (the DAG's serial steps between layers: the last fan-out jobs, the fan-in that
  rolls the container up and activates the next one, the head that releases the next
  fan-out);
* ``backlog``: outcomes written while the claim runs beside them on another connection;
* ``finalize``: outcomes only (every slot busy, or the flusher);
* ``claim``: a claim with nothing to write.

Per drain: the rate, the wall time from first to last round, and per kind of round the
count, the summed and the median duration, the jobs finalized and leased. The pump and the
flusher overlap, so the sums may exceed the wall time. ``--dump N`` prints the first N
rounds of each DAG drain. A diagnostic, not a supported interface: it wraps the round
strategies' ``run`` and the outcome pipeline's ``flush`` (aiojobqueue/worker/).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections import defaultdict
from typing import Any, NamedTuple

import run as R  # bench/run.py (its sys.path set-up makes the peer harness importable)

from aiojobqueue.worker import outcomes as O
from aiojobqueue.worker import rounds as W

DB = "bench_ajq_timeline"


class Round(NamedTuple):
    start: float
    end: float
    written: int  # outcomes queued when the round began
    want: int
    leased: int
    backlog: bool

    @property
    def kind(self) -> str:
        if not self.written:
            return "claim"
        if not self.want:
            return "finalize"
        return "backlog" if self.backlog else "step"


ROUNDS: list[Round] = []


def _timed(cls: Any) -> None:
    """Record every round of ``cls`` (a round strategy of worker/rounds.py)."""
    run = cls.run

    async def timed_run(self: Any, want: int, types: list[str], quick: bool
                        ) -> tuple[bool, list[Any]]:
        t0, written = time.perf_counter(), len(self.outcomes.outbox)
        backlog = self.state.backlog
        out = await run(self, want, types, quick)
        ROUNDS.append(Round(t0, time.perf_counter(), written, want, len(out[1]), backlog))
        return out

    cls.run = timed_run


for _cls in (W.ParallelRound, W.SharedRound):
    _timed(_cls)
_flush = O.Outcomes.flush


async def _timed_flush(self: O.Outcomes) -> bool:
    """The flusher's writes: rounds with nothing to claim."""
    t0, written = time.perf_counter(), len(self.outbox)
    ok = await _flush(self)
    ROUNDS.append(Round(t0, time.perf_counter(), written, 0, 0, self.state.backlog))
    return ok


O.Outcomes.flush = _timed_flush  # type: ignore[method-assign]


async def drain(conc: int, n: int, dag: bool, dump: int) -> list[str]:
    dsn, jobs = await R.loaded(DB, n, dag)
    ROUNDS.clear()
    span, v = await R.drain_aiojobqueue(dsn, conc)
    for k in ("completed", "distinct"):  # the containers are done too, never run
        v[k] -= 20 if dag else 0
    if R.check(v, jobs) != "ok":
        raise SystemExit(f"drain failed its check: {v}")
    rounds = [r for r in ROUNDS if r.written or r.leased]
    t0 = min(r.start for r in rounds)
    wall = max(r.end for r in rounds) - t0
    by: dict[str, list[Round]] = defaultdict(list)
    for r in rounds:
        by[r.kind].append(r)
    label = f"{'DAG' if dag else 'flat'} C={conc}"
    lines = []
    for kind in ("step", "backlog", "finalize", "claim"):
        rs = by.get(kind, [])
        if not rs:
            continue
        took = [r.end - r.start for r in rs]
        lines.append(
            f"| {label} | {jobs / span:,.0f}/s | {wall * 1e3:,.0f} ms | {kind} | {len(rs)} | "
            f"{sum(took) * 1e3:,.0f} ms ({sum(took) / wall:.0%}) | "
            f"{statistics.median(took) * 1e3:.1f} ms | {sum(r.written for r in rs):,} | "
            f"{sum(r.leased for r in rs):,} |")
    if dag and dump:
        for r in rounds[:dump]:
            lines.append(f"    {(r.start - t0) * 1e3:8.2f} ms  {(r.end - r.start) * 1e3:6.2f} ms  "
                         f"{r.kind:8s} wrote {r.written:4d}  want {r.want:4d}  "
                         f"leased {r.leased:4d}")
    return lines


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conc", type=int, default=50)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--dump", type=int, default=0, help="print the first N rounds of a DAG")
    args = ap.parse_args()
    print("| drain | jobs/s | wall | round | count | summed (of wall) | median | written "
          "| leased |")
    print("|---|---|---|---|---|---|---|---|---|")
    for _rep in range(args.reps):
        for dag in (False, True):
            print("\n".join(await drain(args.conc, args.n, dag, args.dump)), flush=True)


if __name__ == "__main__":
    asyncio.run(main())

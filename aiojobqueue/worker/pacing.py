"""When a busy worker's next round may wait, so that it carries more.

A worker with a backlog runs its rounds back to back, each writing what finished since the
last one and leasing as many replacements. With few slots per process (the same total
concurrency spread over many processes) each round then carries one or two jobs: a commit
or two per job, which is what the database pays for most (bench/scale.py, docs/deploying.md).
Where nothing is waiting on the round, it waits instead (``Pacer.hold``) until it carries
half the worker's usual lease (``capacity`` plus its prefetch), for at most ROUND_HOLD after
the oldest outcome it would write (three times that on MySQL/MariaDB, whose rounds cost
more statements: rounds.WIDE_HOLD), and only while the jobs in its buffer keep every slot
busy for MARGIN times as long as a round takes here (so the round lands before a slot runs
dry). Nothing is waiting when:

* the worker holds at least one leased job per slot in its buffer, so no slot runs dry
  meanwhile, and a job its claim would lease now would only wait behind them (better left
  to a worker with a free slot);
* every outcome to write is of a job with no parent and no dependents when it was leased
  (``WorkerState.alone``): its finalize makes no other job runnable, so a DAG's critical
  path never waits on a hold; only ``wait()`` on such a job sees its result later;
* the round kind shares the database with no one else's writes (not SQLite's one writer,
  whose rounds already take few leases ahead) and counts no cap (a capped worker leases
  nothing ahead, so it has no buffer to run from).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..finalize import Outcome
from .state import WorkerState

#: the longest a finished attempt's write is held back to join a larger round, seconds
ROUND_HOLD = 0.02
#: a round starts while its buffer still keeps every slot busy for this many rounds
MARGIN = 2.0


class Pacer:
    """How long the next round may wait, from how long rounds take here."""

    def __init__(self) -> None:
        #: moving average of a round's duration, seconds (None: none ran yet)
        self.round_time: float | None = None

    def ran(self, took: float) -> None:
        """A round took ``took`` seconds."""
        rt = self.round_time
        self.round_time = took if rt is None else rt + (took - rt) * 0.2

    def hold(self, state: WorkerState, outbox: Sequence[Outcome], queued_at: float,
             capacity: int, usual: int, avg_run: float | None, want: int, now: float,
             scale: float = 1.0) -> float:
        """Seconds the next round may still wait (0 or less: run it now). ``outbox``: the
        outcomes it would write, the oldest queued at ``queued_at``; ``usual``: what the
        worker leases when all its slots and its prefetch are free; ``want``: what it
        would lease now; ``avg_run``: the handlers' recent average run time (monotonic
        seconds throughout); ``scale``: the round kind's multiple of ROUND_HOLD
        (ParallelRound.hold_scale)."""
        rt = self.round_time
        if rt is None or avg_run is None or state.stopping or want * 2 >= usual:
            return 0.0
        buffered = len(state.buffer)
        if buffered < capacity:
            return 0.0
        if not all(state.alone(o.job_id, o.attempt) for o in outbox):
            return 0.0
        lasts = buffered * avg_run / capacity  # how long the buffer keeps every slot busy
        longest = ROUND_HOLD * scale
        return min((queued_at if outbox else now) + longest, now + lasts - MARGIN * rt) - now

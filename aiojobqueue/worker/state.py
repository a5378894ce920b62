"""What the parts of one serving worker share: the attempts it runs, the leases it holds
but has not started yet, why it cancelled an attempt, and its wake event."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from ..claimed import Claimed
from ..executor import Reasons


@dataclass
class Running:
    """An attempt this worker runs."""

    claimed: Claimed
    task: asyncio.Task[None]
    #: monotonic time at which the last transaction known to have set this lease began: the
    #: lease is certainly valid until renewed_at + lease_ttl (the database clock set it later).
    renewed_at: float
    outcome_queued: bool = False
    started: float = field(default_factory=time.monotonic)


@dataclass(eq=False)
class WorkerState:
    """The serving worker's shared state (see the module docstring)."""

    running: dict[int, Running] = field(default_factory=dict)
    #: why the worker cancelled an attempt, by (job id, attempt): see executor.run_attempt
    reasons: Reasons = field(default_factory=dict)
    #: leased (prefetched or just claimed) jobs waiting for a free handler slot, with the
    #: monotonic time their lease was taken
    buffer: deque[tuple[Claimed, float]] = field(default_factory=deque)
    #: held jobs (state ``leased``, counted by no cap) by group, with the monotonic time of
    #: their lease: one starts only in a slot of its group whose job just ended (see
    #: Holding.next_for, Slots.take_over)
    held: dict[str, deque[tuple[Claimed, float]]] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    stopping: bool = False
    #: a claim is in flight (its rows may be committed but not yet started here)
    claiming: bool = False
    #: monotonic start of the last heartbeat that went through
    beat_ok_at: float = 0.0
    #: the last claim got all it asked for (a backlog to run through)
    backlog: bool = False
    #: moving average of handler run time, seconds (None before the first)
    avg_run: float | None = None
    #: the most jobs this process runs at once under the global cap while other live
    #: workers serve its types (aiojobqueue.share), or None: its capacity
    share: int | None = None

    def held_count(self) -> int:
        """How many jobs this worker holds ahead."""
        return sum(len(q) for q in self.held.values())

    def alone(self, job_id: int, attempt: int) -> bool:
        """Whether the job had no parent and no dependents when leased: finalizing it makes
        no other job runnable (the finalize re-checks under the row lock)."""
        r = self.running.get(job_id)
        return (r is not None and r.claimed.attempt == attempt
                and r.claimed.parent_id is None and not r.claimed.has_dependents)

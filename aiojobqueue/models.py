"""Public value types: Job snapshots and the state enum."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any


class JobState(StrEnum):
    """Where a job is. Terminal: DONE, FAILED, CANCELLED."""

    WAITING = "waiting"  #: blocked on dependencies (or its container's)
    SCHEDULED = "scheduled"  #: runnable once run_after passes (also: retry backoff)
    READY = "ready"  #: runnable now
    RUNNING = "running"  #: leased by a worker
    #: leased ahead by a worker into a slot it holds under a counted cap (not yet started;
    #: not counted by the caps)
    LEASED = "leased"
    ACTIVE = "active"  #: a container whose children may run
    #: an external step waiting for ``complete()`` / ``fail()`` (or its timeout)
    EXTERNAL = "external"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (JobState.DONE, JobState.FAILED, JobState.CANCELLED)


@dataclass(frozen=True)
class Job:
    """A snapshot of one job (or container) as stored."""

    id: int
    type: str
    args: dict[str, Any]
    state: JobState
    result: Any
    error: dict[str, Any] | None
    attempts: int
    max_attempts: int
    group: str
    weight: int
    priority: int
    parent_id: int | None
    is_container: bool
    key: str | None
    depends_on: tuple[int, ...]
    cancelled_by: int | None
    lease_owner: str | None
    created_at: datetime
    run_after: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    #: What the handler last reported with ``ctx.progress()``: ``{"done", "total",
    #: "message", "at"}`` (``at``: a datetime, UTC), or None.
    progress: dict[str, Any] | None = None
    #: Every failed attempt, oldest first, each ``{"attempt", "type", "message",
    #: "traceback", "worker", "at"}``; kept when the job later succeeds. Bounded: the last
    #: ``history.KEEP`` (20) attempts, with ``errors_omitted`` counting the older ones.
    errors: tuple[dict[str, Any], ...] = field(default=())
    #: How many failed attempts older than those in ``errors`` were dropped.
    errors_omitted: int = 0
    #: How many times a handler raised ``Snooze`` (none of them used an attempt).
    snoozes: int = 0
    #: An external step (``b.external`` / ``enqueue_external``): no worker runs it.
    is_external: bool = False
    #: The job's tags (``enqueue(..., tags=[...])``), sorted.
    tags: tuple[str, ...] = ()
    #: Attempts given back without an outcome (graceful shutdown, a lease that could not be
    #: renewed, a job held ahead and returned unstarted); never counted against the limit.
    releases: int = 0
    #: The claim number past which a failure is final: ``max_attempts`` at first, moved up
    #: by each release and reset to ``attempts + max_attempts`` by a manual retry.
    attempt_limit: int = 0

    @property
    def failures(self) -> int:
        """Failed attempts, all rounds (``errors`` plus the ones it no longer keeps)."""
        return len(self.errors) + self.errors_omitted

    @property
    def runs(self) -> int:
        """Attempts that ran to an outcome or run now (``attempts`` without releases)."""
        return max(self.attempts - self.releases, 0)


    @property
    def terminal(self) -> bool:
        return self.state.terminal

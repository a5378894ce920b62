"""What an operator changes while the queue runs, as ``JobQueue`` methods: the stored policy
(stored_policy.py: caps, weights, rates, pauses) and the schedules (schedules.py). The
command line and the dashboard make the same changes through the same functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import schedules as schedule_ops
from . import stored_policy
from .limits import RateLimit
from .schedules import ScheduleInfo
from .stored_policy import UNSET, Policy, Unset

if TYPE_CHECKING:
    from .core import Core


class Operations:
    """``JobQueue``'s policy and schedule methods (a mixin: ``_started`` is JobQueue's)."""

    def _started(self) -> Core:
        raise NotImplementedError

    # -- the policy in the database (stored_policy.py) -----------------------------------
    async def policy(self) -> Policy:
        """The policy in force, as stored: caps, weights, rates and pauses."""
        return await stored_policy.read_policy(self._started().db)

    async def set_policy(self, *, concurrency: int | Unset | None = UNSET,
                         rate: RateLimit | Unset | None = UNSET) -> None:
        """Set the fleet-wide cap and/or the queue's rate; None clears one, an argument
        not given is left as it is. Every worker sees it within ``poll_interval``."""
        core = self._started()
        await stored_policy.set_policy(core.db, concurrency=concurrency, rate=rate)
        _policy_changed(core)

    async def set_group(self, name: str, *, weight: int | Unset | None = UNSET,
                        cap: int | Unset | None = UNSET,
                        rate: RateLimit | Unset | None = UNSET) -> None:
        """Set group ``name``'s weight, cap and/or rate (None clears one). ``"*"`` is the
        row every group without one of its own takes its cap and rate from."""
        core = self._started()
        await stored_policy.set_group(core.db, name, weight=weight, cap=cap, rate=rate)
        _policy_changed(core)

    async def pause(self, *, group: str | None = None, type: str | None = None) -> None:
        """Start no job of ``group``, of ``type``, or (neither) of the whole queue until
        ``resume``; running jobs finish."""
        core = self._started()
        await stored_policy.pause(core.db, group=group, type=type)
        _policy_changed(core)

    async def resume(self, *, group: str | None = None, type: str | None = None) -> None:
        """Undo ``pause`` with the same arguments."""
        core = self._started()
        await stored_policy.resume(core.db, group=group, type=type)
        _policy_changed(core)

    # -- schedules (aiojobqueue.schedules) -------------------------------------------------
    async def schedules(self) -> list[ScheduleInfo]:
        """Every schedule in the database: spec, paused, last slot enqueued, next slot."""
        return await schedule_ops.list_schedules(self._started().db)

    async def pause_schedule(self, name: str) -> bool:
        """Stop every worker enqueuing the schedule's slots (the one enqueued ahead is
        cancelled unless it started). False if it was paused already.
        Raises ScheduleNotFoundError."""
        return await schedule_ops.pause(self._started(), name)

    async def resume_schedule(self, name: str) -> bool:
        """Enqueue the schedule's slots again, from the next one (slots missed while paused
        are skipped). False if it was not paused. Raises ScheduleNotFoundError."""
        return await schedule_ops.resume(self._started().db, name)

    async def trigger_schedule(self, name: str) -> int:
        """Enqueue one job of the schedule now (its slots stay as they are); its id.
        Raises ScheduleNotFoundError."""
        core = self._started()
        job_id = await schedule_ops.trigger(core.db, core.batch_on, name)
        core.signals.wake()
        return job_id


def _policy_changed(core: Core) -> None:
    """This process's worker reads the policy again before its next claim (others: at
    their next look, or at once on the NOTIFY the change sent)."""
    core.claimer.live.stale = True
    core.signals.wake()

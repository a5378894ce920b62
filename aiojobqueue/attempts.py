"""Attempts as a user reads them: pure functions of a job's stored counters.

A job's ``attempts`` column counts every claim; ``attempt_limit`` is the claim number past
which a failure is final. A manual retry starts a new round (``attempt_limit`` becomes
``attempts + max_attempts``) and a released attempt (graceful shutdown, an unrenewable
lease) moves the limit up by one, so ``attempt_limit - max_attempts`` claims of the job's
history do not count against the round in force.
"""

from __future__ import annotations

from typing import Protocol


def round_attempt(attempts: int, attempt_limit: int, max_attempts: int) -> int:
    """The attempt number within the round in force (1 for its first counted attempt): what
    the retry backoff grows with, so a manual retry runs now and then backs off from the
    start again, and released attempts add no delay."""
    return max(attempts - (attempt_limit - max_attempts), 1)


class _Counted(Protocol):
    """What the formatting needs of a job (``Job`` has it; so do the dashboard's rows)."""

    @property
    def attempts(self) -> int: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def attempt_limit(self) -> int: ...
    @property
    def releases(self) -> int: ...


def in_round(j: _Counted) -> int:
    """Counted attempts in the round in force (0 before its first)."""
    return max(j.attempts - (j.attempt_limit - j.max_attempts), 0)


def retried(j: _Counted) -> bool:
    """Whether a manual retry started the round in force (after runs before it)."""
    return j.attempt_limit - j.releases > j.max_attempts


def attempts_short(j: _Counted) -> str:
    """The compact form for lists and trees: ``counted/max`` in the round in force (the
    ``attempts 4 of 3`` of a job released twice reads ``2/3``), ``↻`` after a manual retry."""
    return f"{in_round(j)}/{j.max_attempts}" + (" ↻" if retried(j) else "")


def attempts_text(j: _Counted, failures: int) -> str:
    """The long form for a job's page (the CLI's ``show``, the dashboard's job page): runs,
    failures (``failures``: ``Job.failures``), releases, and the limit in force, e.g.
    ``1 run, 2 released (not counted); attempt 1 of 3`` or ``4 runs, 4 failed; attempt 2 of
    2 since the manual retry``."""
    runs = max(j.attempts - j.releases, 0)
    parts = [f"{runs} run{'' if runs == 1 else 's'}"]
    if failures:
        parts.append(f"{failures} failed")
    if j.releases:
        parts.append(f"{j.releases} released (not counted)")
    since = " since the manual retry" if retried(j) else ""
    return f"{', '.join(parts)}; attempt {in_round(j)} of {j.max_attempts}{since}"

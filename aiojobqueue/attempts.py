"""Attempts as a user reads them: pure functions of a job's stored counters.

A job's ``attempts`` column counts every claim; ``attempt_limit`` is the claim number past
which a failure is final. A manual retry starts a new round (``attempt_limit`` becomes
``attempts + max_attempts``) and a released attempt (graceful shutdown, an unrenewable
lease) moves the limit up by one, so ``attempt_limit - max_attempts`` claims of the job's
history do not count against the round in force.
"""

from __future__ import annotations


def round_attempt(attempts: int, attempt_limit: int, max_attempts: int) -> int:
    """The attempt number within the round in force (1 for its first counted attempt): what
    the retry backoff grows with, so a manual retry runs now and then backs off from the
    start again, and released attempts add no delay."""
    return max(attempts - (attempt_limit - max_attempts), 1)

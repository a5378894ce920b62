"""What ``queue.explain(job_id)`` answers: an ``Explanation`` (the job, its state and its
reasons, readable as a paragraph or as JSON) made of ``Reason``s, each with a code of
``CODES``. How the reasons are found is explain.py's."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .models import JobState

CODES = ("terminal", "running", "external", "waiting_on", "condition", "scheduled", "backoff",
         "no_worker", "paused", "global_cap", "group_cap", "rate_limit", "limit", "fair_share",
         "ready")


@dataclass(frozen=True)
class Reason:
    """One thing that holds a job (or says that nothing does): ``code`` is one of CODES,
    ``detail`` a sentence, ``data`` the numbers behind it."""

    code: str
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Explanation:
    """Why a job is not running now: ``str()`` of it is a short readable paragraph."""

    job_id: int
    type: str
    group: str
    state: JobState
    reasons: list[Reason]

    @property
    def codes(self) -> list[str]:
        """The reasons' codes, in order."""
        return [r.code for r in self.reasons]

    def __str__(self) -> str:
        head = f"Job {self.job_id} ({self.type}, group {self.group!r}) is {self.state.value}."
        return " ".join([head, *(r.detail for r in self.reasons)])

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: times as ISO strings (for ``explain --json`` and web APIs)."""
        return {"job_id": self.job_id, "type": self.type, "group": self.group,
                "state": self.state.value, "text": str(self),
                "reasons": [{"code": r.code, "detail": r.detail, "data": _jsonable(r.data)}
                            for r in self.reasons]}


def _jsonable(v: Any) -> Any:
    if isinstance(v, datetime):
        return v.isoformat()
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v

"""How the worker logs an attempt: one record per start and per end, job fields as extra."""

from __future__ import annotations

import logging
from typing import Any

from ..claimed import Claimed
from ..hooks import JobEvent

log = logging.getLogger("aiojobqueue.worker")
#: One record per attempt start/end; silence it alone to keep warnings but not per-job lines.
jlog = logging.getLogger("aiojobqueue.jobs")

#: The level report() logs each way an attempt can end at (the others: INFO).
LEVEL = {"retry": logging.WARNING, "failed": logging.ERROR, "discarded": logging.WARNING}


def extra(worker_id: str, c: Claimed) -> dict[str, Any]:
    """The ``extra`` of a record about ``c``."""
    return {"job_id": c.id, "job_type": c.type, "attempt": c.attempt, "worker": worker_id,
            "group": c.group}


def report(ev: JobEvent) -> None:
    """Log how an attempt ended: one record at its LEVEL, with the job fields as ``extra``."""
    level = LEVEL.get(ev.event, logging.INFO)
    if not jlog.isEnabledFor(level):
        return
    took = f" in {ev.duration:.2f}s" if ev.duration is not None else ""
    err = ev.error or {}
    why = f"{err.get('type', '?')}: {err.get('message', '')}"
    head = f"job {ev.job_id} ({ev.type}) attempt {ev.attempt}"
    args: tuple[Any, ...]
    if ev.event == "retry":
        msg, args = "%s failed%s (%s); retry in %.1fs", (head, took, why, ev.retry_in or 0.0)
    elif ev.event == "failed":
        msg, args = "%s failed for good%s (%s)", (head, took, why)
    elif ev.event == "snoozed":
        msg, args = "%s snoozed for %.1fs%s", (head, ev.retry_in or 0.0, took)
    elif ev.event == "discarded":
        msg, args = "%s: outcome discarded, lease no longer held", (head,)
    else:
        msg, args = "%s %s%s", (head, ev.event, took)
    jlog.log(level, msg, *args, extra=ev.log_extra())

"""Lifecycle hooks a user can attach metrics or tracing to: ``queue.on(event, fn)``.

Events, each emitted once per attempt by the worker that saw it happen:

* ``start``     an attempt was claimed and its handler is starting;
* ``done``      the attempt succeeded and its result was stored;
* ``retry``     the attempt failed (exception, timeout, lost worker) and the job will run
                again after a backoff (``event.retry_in`` seconds);
* ``failed``    the attempt failed and no attempts are left: the job failed for good;
* ``cancelled`` the job was cancelled while this attempt ran;
* ``released``  shutdown interrupted the attempt; the job is runnable again at once and
                the attempt does not count;
* ``discarded`` the attempt finished but its lease was gone (it was reclaimed or
                cancelled meanwhile), so its outcome was fenced out and changed nothing.

An attempt whose worker died is finalised by whichever worker reclaims its expired lease;
that worker emits the ``retry`` or ``failed`` event (``event.reclaimed`` is True), so each
attempt is counted once across the whole fleet.

Hooks run on the worker's event loop, after the outcome is committed. A hook must be quick:
a hook that raises is logged and never affects the job; an ``async`` hook is started as a
task and not awaited.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("aiojobqueue.hooks")

EVENTS = ("start", "done", "retry", "failed", "cancelled", "released", "discarded", "snoozed")


@dataclass(frozen=True)
class JobEvent:
    """What a hook receives: one thing that happened to one attempt of one job."""

    #: One of ``EVENTS``.
    event: str
    job_id: int
    type: str
    group: str
    #: The attempt number (1 for the first run).
    attempt: int
    #: The worker that ran the attempt (for a reclaimed attempt: the worker that died).
    worker_id: str
    #: Seconds the attempt ran, measured by the worker (None for ``start`` and reclaims).
    duration: float | None = None
    #: ``{"type", "message", "traceback"}`` for retry/failed/cancelled, else None.
    error: dict[str, Any] | None = None
    #: For ``retry`` and ``snoozed``: seconds until the job becomes runnable again.
    retry_in: float | None = None
    #: True when the worker that ran the attempt died and another one finalised it.
    reclaimed: bool = False

    def log_extra(self) -> dict[str, Any]:
        """The ``extra=`` fields every job-related log record carries."""
        return {"job_id": self.job_id, "job_type": self.type, "attempt": self.attempt,
                "worker": self.worker_id, "group": self.group}


Hook = Callable[[JobEvent], Any]


class Hooks:
    """Callbacks per event; a failing hook is logged and never affects the job."""

    def __init__(self) -> None:
        self._fns: dict[str, list[Hook]] = defaultdict(list)
        self._tasks: set[asyncio.Task[Any]] = set()

    def add(self, event: str, fn: Hook) -> None:
        if event not in EVENTS:
            raise ValueError(f"unknown hook event {event!r}; one of {', '.join(EVENTS)}")
        if not callable(fn):
            raise TypeError(f"hook for {event!r} must be callable, got {fn!r}")
        self._fns[event].append(fn)

    def __bool__(self) -> bool:
        return any(self._fns.values())

    def emit(self, ev: JobEvent) -> None:
        for fn in self._fns.get(ev.event, ()):
            try:
                r = fn(ev)
                if asyncio.iscoroutine(r):
                    task = asyncio.ensure_future(r)
                    self._tasks.add(task)  # keep a reference until it ends
                    task.add_done_callback(self._reaped)
            except Exception:
                log.exception("hook %r for %s raised", fn, ev.event, extra=ev.log_extra())

    def _reaped(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("async hook raised", exc_info=task.exception())

"""The two in-process wake-ups of a started queue: the local worker's (a job this process
enqueued, released or retried can start at once) and ``done`` (``JobQueue.wait`` looks
again when this process has finished something)."""

from __future__ import annotations

import asyncio


class Signals:
    """In-process wake-ups (see the module docstring)."""

    def __init__(self) -> None:
        #: the serving worker's wake event, while one serves
        self.worker: asyncio.Event | None = None
        #: set (and replaced) whenever this process has written outcomes
        self.done = asyncio.Event()

    def wake(self) -> None:
        """Wake the local worker, if one serves: it claims at once."""
        if self.worker is not None:
            self.worker.set()

    def finished(self) -> None:
        """Outcomes landed: wake whoever waits on ``done``."""
        self.done.set()
        self.done = asyncio.Event()

"""Core: the parts of one started queue, built once by ``JobQueue.start`` and handed to the
worker. Each part takes only what it needs from here; none of them sees the facade.

``Signals`` carries the two in-process wake-ups: the local worker's (a job this process
enqueued, released or retried can start at once) and ``done`` (``JobQueue.wait`` looks again
when this process has finished something).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .actions import Actions
from .claim import Claimed, Claimer
from .database import Database
from .fanout import SplitReleases
from .finalize import Finalizer
from .hooks import Hooks
from .settings import Settings
from .settle import Settler

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

    from .batch import Batch
    from .executor import HandlerSpec, JobContext
    from .periodic import Schedule
    from .worker.rounds import ParallelRound


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


@dataclass(eq=False)
class Core:
    """One started queue's parts (see the module docstring)."""

    settings: Settings
    db: Database
    claimer: Claimer
    settler: Settler
    finalizer: Finalizer
    actions: Actions
    splits: SplitReleases
    signals: Signals
    hooks: Hooks
    handlers: Mapping[str, HandlerSpec]
    schedules: Mapping[str, Schedule]
    #: builds the ``ctx`` a handler gets (it names the facade: ``ctx.queue``)
    make_context: Callable[[Claimed], JobContext]
    #: a batch inserting on the given connection (periodic schedules)
    batch_on: Callable[[AsyncConnection], Batch]
    #: the dialect's round strategy class for this database (see worker/rounds.py)
    round_kind: type[ParallelRound]

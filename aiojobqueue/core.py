"""Core: the parts of one started queue, built once (``build_core``, when ``JobQueue.start``
connects) and handed to the worker. Each part takes only what it needs from here; none of
them sees the facade.

Its ``signals`` (signals.py) are the in-process wake-ups.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .actions import Actions
from .claim import Claimed, Claimer
from .database import Database
from .fanout import SplitReleases
from .finalize import Finalizer
from .hooks import Hooks
from .insert import Inserter
from .settings import Settings
from .settle import Settler
from .signals import Signals

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

    from .batch import Batch
    from .executor import HandlerSpec, JobContext
    from .migrate import Routines
    from .periodic import Schedule
    from .worker.rounds import ParallelRound


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


def build_core(s: Settings, db: Database, routines: Routines | None, *,
               round_kind: type[ParallelRound], hooks: Hooks,
               handlers: Mapping[str, HandlerSpec], schedules: Mapping[str, Schedule],
               make_context: Callable[[Claimed], JobContext],
               batch_on: Callable[[AsyncConnection], Batch]) -> tuple[Core, Inserter]:
    """The parts of a queue just connected (``routines``: the dialect's one-call finalize
    routines, where it has them), and the inserter its enqueues use."""
    signals = Signals()
    claimer = Claimer(s, db)
    settler = Settler(db, db.ops.write_path(db, routines.release if routines else None))
    splits = SplitReleases(db, routines.rest if routines else None, signals.wake)
    finalizer = Finalizer(s, db, settler, routines.finish if routines else None,
                          splits.release_rest)
    core = Core(
        settings=s, db=db, claimer=claimer, settler=settler, finalizer=finalizer,
        actions=Actions(db, settler), splits=splits, signals=signals, hooks=hooks,
        handlers=handlers, schedules=schedules, make_context=make_context,
        batch_on=batch_on, round_kind=round_kind,
    )
    return core, Inserter(db, claimer, settler, signals)

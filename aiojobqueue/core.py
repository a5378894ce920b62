"""Core: the parts of one started queue, built once and handed to the worker. Each part
takes only what it needs from here; none of them sees the facade.

``open_core`` is what ``JobQueue.start`` does: open (or adopt) the engine, pick the dialect,
create or check the schema, install the dialect's routines, then build the parts
(``build_core``); ``close_core`` takes them down in order (``JobQueue.close``). Its
``signals`` (signals.py) are the in-process wake-ups.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import threads
from .actions import Actions
from .claim import Claimer
from .claimed import Claimed
from .database import Database
from .dialects.urls import dialect_for, open_engine
from .fanout import SplitReleases
from .finalize import Finalizer
from .finalize_routines import install_routines
from .hooks import Hooks
from .insert import Inserter
from .live_policy import declare
from .migrate import check, upgrade
from .release import LockedWrites, ReturningWrites
from .schema import Tables
from .settings import Settings
from .settle import Settler
from .signals import Signals

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

    from .batch import Batch
    from .executor import HandlerSpec, JobContext
    from .finalize_routines import Routines
    from .periodic import Clock, Schedule


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
    #: the dialect's round strategy for this database, by its name in
    #: ``worker.loop.ROUNDS`` (see worker/rounds.py)
    round_kind: str
    #: the engine is aiojobqueue's (built from a URL): close_core disposes of it
    owns_engine: bool = False
    #: the schedules' clock (JobQueue.schedule_clock; None: the database's)
    schedule_clock: Clock | None = None


def build_core(s: Settings, db: Database, routines: Routines | None, *,
               round_kind: str, hooks: Hooks,
               handlers: Mapping[str, HandlerSpec], schedules: Mapping[str, Schedule],
               make_context: Callable[[Claimed], JobContext],
               batch_on: Callable[[AsyncConnection], Batch]) -> tuple[Core, Inserter]:
    """The parts of a queue just connected (``routines``: the dialect's one-call finalize
    routines, where it has them), and the inserter its enqueues use."""
    signals = Signals()
    claimer = Claimer(s, db)
    settler = Settler(db, ReturningWrites(db, routines.release if routines else None)
                      if db.ops.returning else LockedWrites(db))
    splits = SplitReleases(db, routines.rest if routines else None, signals.wake)
    finalizer = Finalizer(s, db, settler, routines.finish if routines else None,
                          splits.release_rest)
    core = Core(
        settings=s, db=db, claimer=claimer, settler=settler, finalizer=finalizer,
        actions=Actions(db, settler), splits=splits, signals=signals, hooks=hooks,
        handlers=handlers, schedules=schedules, make_context=make_context,
        batch_on=batch_on, round_kind=round_kind,
    )
    return core, Inserter(db, settler, signals)


async def open_core(url: str | AsyncEngine, s: Settings, tables: Tables, *, migrate: bool,
                    hooks: Hooks, handlers: Mapping[str, HandlerSpec],
                    schedules: Mapping[str, Schedule],
                    make_context: Callable[[Database], Callable[[Claimed], JobContext]],
                    batch_on: Callable[[AsyncConnection], Batch]) -> tuple[Core, Inserter]:
    """Connect to ``url`` (an async URL: an engine of ``s.pool_size`` connections is built,
    and owned; an ``AsyncEngine``: used as it is), create or upgrade the schema (``migrate``;
    else check that it is current: SchemaError), and build the parts (``make_context(db)``:
    what builds a handler's ``ctx``). On failure what it opened is given back before the
    error propagates."""
    from sqlalchemy.ext.asyncio import AsyncEngine

    owned = not isinstance(url, AsyncEngine)
    engine = url if isinstance(url, AsyncEngine) else await open_engine(url, s.pool_size)
    ops = dialect_for(engine, tables, s.listen_url)
    engine = ops.prepare_engine(engine)
    db = Database(engine, ops, tables, s.worker_id)
    try:
        await (upgrade(db) if migrate else check(db))
        routines = await install_routines(db, create=migrate)
        await declare(db, s)
    except BaseException:
        await ops.release()
        if owned:
            await engine.dispose()
        raise
    core, inserter = build_core(
        s, db, routines, round_kind=ops.round_kind(routines is not None), hooks=hooks,
        handlers=handlers, schedules=schedules, make_context=make_context(db),
        batch_on=batch_on)
    core.owns_engine = owned
    await core.claimer.live.refresh(db, force=True)
    return core, inserter


async def close_core(core: Core) -> None:
    """Take a started queue down: split releases in flight land first (a part left is a
    sweep's), then the dialect gives back what it holds, then the engine aiojobqueue built
    is disposed of (a passed-in one is left alone)."""
    await core.splits.close()
    threads.close(core)
    await core.db.ops.release()
    if core.owns_engine:
        await core.db.engine.dispose()

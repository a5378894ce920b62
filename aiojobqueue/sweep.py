"""What the retention sweep deletes, and how (the lease and the loop are retention.py's).

The unit is a whole finished DAG: the connected component of a top-level job over container
links (parent and children) and dependency edges (both ways). It goes when every job in it
is terminal, each top-level job in it has a retention (by its state), and every job
finished longer ago than the longest of those. So a job another live job depends on, a
container with a live child, a job whose DAG is still running or was finished recently:
all stay.

Each batch is read first without locks (the component walk stops at a live job: its
component is kept anyway), then deleted in transactions of at most ROWS jobs, the sweep
resting REST times what it worked after each. Each renews the sweeper's lease, locks the
doomed rows (all terminal: no claim or finalize waits on them), checks again that nothing
changed (state, finish time, a new dependent or child since the read: then that component
is left for the next sweep), and deletes the jobs with their edges, tags and stale release
records.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, delete, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .sql import chunks, lit
from .tags import delete_tags
from .timeutil import db_now

if TYPE_CHECKING:
    from .database import Database

log = logging.getLogger("aiojobqueue.retention")

#: A component walk stops (and keeps what it has not finished walking) past this many jobs.
CAP = 20_000
#: The most jobs deleted in one transaction (a larger DAG alone is one transaction): small,
#: so a transaction holds SQLite's write lock (elsewhere, a connection) briefly.
ROWS = 200
#: After each transaction the sweep rests this many times what it just worked (its reads,
#: its walk in Python, the transaction): it takes at most a third of a worker's time and
#: of the database's, however fast the machine.
REST = 2.0

Renew = Callable[[AsyncConnection], Awaitable[bool]]


@dataclass
class Component:
    """A connected set of jobs: ``rows`` by id; ``open``: not walked to its end (kept)."""

    rows: dict[int, Any] = field(default_factory=dict)
    open: bool = False


async def sweep(db: Database, policy: Mapping[str, timedelta], renew: Renew,
                batch: int = 500, pause: float = 0.05) -> int:
    """Delete the finished DAGs older than ``policy`` (see the module docstring), ``batch``
    top-level jobs looked at per transaction; returns how many jobs went. Stops early
    (returning what it deleted) once ``renew`` says the lease is lost."""
    now = await db.read(_now)
    cutoffs = {s: now - age for s, age in policy.items() if s in S.TERMINAL}
    deleted = 0
    for state, cutoff in cutoffs.items():
        after: tuple[datetime, int] | None = None
        while True:
            began = time.monotonic()
            roots = await db.read(partial(_roots, db, state=state, cutoff=cutoff, after=after,
                                          batch=batch))
            if not roots:
                break
            after = roots[-1]
            seeds = [i for _, i in roots]
            comps = await db.read(partial(components, db, seeds=seeds))
            doomed = [c for c in comps if deletable(c, cutoffs)]
            while doomed:
                part, doomed = _take(doomed, ROWS)
                ids = await db.write(partial(_delete, db, comps=part, renew=renew))
                if ids is None:
                    return deleted
                deleted += len(ids)
                # committed: the ids, for whoever audits the sweep (tests/crash)
                log.debug("retention: deleted %d jobs", len(ids), extra={"ids": ids})
                await asyncio.sleep(max(pause, REST * (time.monotonic() - began)))
                began = time.monotonic()
    return deleted


async def _now(conn: AsyncConnection) -> datetime:
    value = (await conn.execute(select(db_now()))).scalar_one()
    assert isinstance(value, datetime)
    return value


async def _roots(db: Database, conn: AsyncConnection, *, state: str, cutoff: datetime,
                 after: tuple[datetime, int] | None, batch: int) -> list[tuple[datetime, int]]:
    """The next top-level jobs in ``state`` finished before ``cutoff``, oldest first (the
    (state, finished_at) index), after the ``after`` cursor."""
    J = db.t.jobs
    cond = [J.c.state == lit(state), J.c.finished_at.is_not(None), J.c.finished_at < cutoff,
            J.c.parent_id.is_(None)]
    if after is not None:
        cond.append(or_(J.c.finished_at > after[0],
                        and_(J.c.finished_at == after[0], J.c.id > after[1])))
    rows = await conn.execute(select(J.c.finished_at, J.c.id).where(*cond)
                              .order_by(J.c.finished_at, J.c.id).limit(batch))
    return [(r[0], int(r[1])) for r in rows]


async def components(db: Database, conn: AsyncConnection, *, seeds: list[int]) -> list[Component]:
    """The components of ``seeds`` (no locks). Not walked past a live job, nor past CAP."""
    J, D = db.t.jobs, db.t.deps
    rows: dict[int, Any] = {}
    up: dict[int, int] = {}

    def find(x: int) -> int:
        while up.setdefault(x, x) != x:
            up[x] = up[up[x]]
            x = up[x]
        return x

    frontier, seen = set(seeds), set(seeds)
    while frontier:
        ids = sorted(frontier)
        frontier = set()
        ends: list[int] = []  # terminal: walked on from
        for part in chunks(ids):
            for r in await conn.execute(select(
                    J.c.id, J.c.parent_id, J.c.state, J.c.finished_at)
                    .where(J.c.id.in_(part))):
                rows[r.id] = r
                find(r.id)
                if r.state in S.TERMINAL:
                    ends.append(r.id)
        links = [(r, rows[r].parent_id) for r in ends if rows[r].parent_id is not None]
        for part in chunks(ends):
            links += [(a, b) for a, b in await conn.execute(
                select(J.c.id, J.c.parent_id).where(J.c.parent_id.in_(part)))]
            links += [(a, b) for a, b in await conn.execute(
                select(D.c.job_id, D.c.depends_on_id).where(
                    or_(D.c.job_id.in_(part), D.c.depends_on_id.in_(part))))]
        for a, b in links:
            up[find(a)] = find(b)
            frontier |= {a, b} - seen
        seen |= frontier
        if len(seen) > CAP:
            break
    comps: dict[int, Component] = {}
    for x in seen:
        c = comps.setdefault(find(x), Component())
        if x in rows:
            c.rows[x] = rows[x]
        elif x in frontier:  # found, never read: not walked to its end
            c.open = True
    return list(comps.values())


def deletable(c: Component, cutoffs: Mapping[str, datetime]) -> bool:
    """Every job terminal and finished before the earliest cutoff of its top-level jobs'
    states (a top-level job in a state without retention keeps the whole component)."""
    if c.open or not c.rows:
        return False
    roots = [r for r in c.rows.values() if r.parent_id is None]
    if not roots or any(r.state not in cutoffs for r in roots):
        return False
    cutoff = min(cutoffs[r.state] for r in roots)
    return all(r.state in S.TERMINAL and r.finished_at is not None and r.finished_at < cutoff
               for r in c.rows.values())


def _take(comps: list[Component], size: int) -> tuple[list[Component], list[Component]]:
    """The first components up to ``size`` jobs (at least one, however large), the rest."""
    n = total = 0
    while n < len(comps) and (n == 0 or total + len(comps[n].rows) <= size):
        total += len(comps[n].rows)
        n += 1
    return comps[:n], comps[n:]


async def _delete(db: Database, conn: AsyncConnection, *, comps: list[Component],
                  renew: Renew) -> list[int] | None:
    """One batch's transaction (see the module docstring): the ids deleted, or None if the
    lease is lost."""
    if not await renew(conn):
        return None
    J, D = db.t.jobs, db.t.deps
    owner = {i: n for n, c in enumerate(comps) for i in c.rows}
    ids = sorted(owner)
    bad: set[int] = set()
    locked: set[int] = set()
    for part in chunks(ids):
        for r in await conn.execute(db.ops.for_update(
                select(J.c.id, J.c.state, J.c.finished_at).where(J.c.id.in_(part))
                .order_by(J.c.id))):
            locked.add(r.id)
            was = comps[owner[r.id]].rows[r.id]
            if r.state != was.state or r.finished_at != was.finished_at:
                bad.add(owner[r.id])  # retried (and maybe finished again) since the read
        # a dependent or a child added since the read
        for a, b in await conn.execute(select(D.c.job_id, D.c.depends_on_id).where(
                or_(D.c.job_id.in_(part), D.c.depends_on_id.in_(part)))):
            if a not in owner or b not in owner:
                bad.add(owner.get(a, owner.get(b, -1)))
        for cid, pid in await conn.execute(select(J.c.id, J.c.parent_id).where(
                J.c.parent_id.in_(part))):
            if cid not in owner:
                bad.add(owner[pid])
    doomed = [i for i in ids if owner[i] not in bad and i in locked]
    for part in chunks(doomed):
        await conn.execute(delete(D).where(D.c.job_id.in_(part)))
        await conn.execute(delete(D).where(D.c.depends_on_id.in_(part)))
        await delete_tags(conn, db.t.tags, part)
        await conn.execute(delete(db.t.releases).where(db.t.releases.c.job_id.in_(part)))
        await conn.execute(delete(J).where(J.c.id.in_(part)))
    return doomed

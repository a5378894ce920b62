"""A process's share of the global cap, so that a second worker process gets work.

Under a global ``concurrency`` cap, the process that starts first would otherwise keep every
slot: its finalize hands each freed slot over to its own next job and it holds jobs ahead for
the slots it has. So each process takes at most its share of the cap among the live workers
that serve any of its job types (from the ``workers`` table): the cap split evenly, no
process given more than its ``capacity`` (what one cannot use goes to the others), rounded
up so the shares never leave a slot of the cap unused while every process has work. Alone,
a process's share is the whole cap. ``cap_share`` is the rule (a pure function); ``watch``
keeps ``WorkerState.share`` up to date, every ``EVERY`` seconds.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from .timeutil import utcnow_plus

if TYPE_CHECKING:
    from .core import Core
    from .worker.state import WorkerState

#: How often a worker re-reads the live workers (one small read): a process that starts
#: gets its share within about this long, plus the time the others' running jobs take.
EVERY = 1.0


@dataclass(frozen=True)
class Peer:
    """A live worker as its registry row describes it."""

    id: str
    capacity: int | None
    types: Collection[str] | None  # None: registered before v6 (serves anything)
    concurrency: int | None  # the global cap it declares


def cap_share(cap: int | None, me: str, capacity: int, types: Collection[str],
              workers: Iterable[Peer]) -> int | None:
    """The most jobs process ``me`` (of ``capacity``, serving ``types``) should run at once
    under the global ``cap`` among ``workers`` (live, itself included or not), or None for
    no limit beyond its capacity (no cap, or no other process serves its types)."""
    peers = [w for w in workers
             if w.id != me and (w.types is None or not types or set(w.types) & set(types))]
    caps = [c for c in [cap, *(w.concurrency for w in peers)] if c is not None]
    if not peers or not caps:
        return None
    total = min(caps)
    sizes = sorted([capacity, *(w.capacity or total for w in peers)])
    # water-filling: the level L where sum(min(size, L)) == total
    left, level = total, math.inf
    for i, size in enumerate(sizes):
        if size * (len(sizes) - i) >= left:
            level = left / (len(sizes) - i)
            break
        left -= size
    if level == math.inf:
        return None  # together they cannot fill the cap: each runs what it can
    return max(1, min(capacity, math.ceil(level)))


async def watch(core: Core, state: WorkerState) -> None:
    """Keep ``state.share`` to this process's share of the cap (a side loop of serve())."""
    s, W = core.settings, core.db.t.workers
    stmt = (select(W.c.id, W.c.capacity, W.c.types)
            .where(W.c.last_seen >= utcnow_plus(-s.lease_ttl)))
    types = sorted(core.handlers)
    async def read(conn: AsyncConnection) -> list[Any]:
        return list((await conn.execute(stmt)).all())

    while True:
        rows = await core.db.read(read)
        # the cap in force is the stored policy's (live_policy), whatever each declared
        peers = [Peer(r.id, r.capacity, r.types, None) for r in rows]
        cap = core.claimer.live.concurrency
        state.share = cap_share(cap, s.worker_id, s.capacity, types, peers)
        await asyncio.sleep(EVERY)


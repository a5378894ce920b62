"""Deleting old finished jobs without breaking a DAG: ``prune`` (``aiojobqueue prune``).

A top-level job goes with its whole container tree, only when all of it finished before the
cutoff and no live job depends on any of it; edges go with their jobs. Ages are measured
against the database clock, like leases."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .admin import now
from .errors import InvalidJobError
from .sql import CHUNK, chunks
from .tags import delete_tags

if TYPE_CHECKING:
    from .dialects.base import DialectOps
    from .queue import JobQueue


_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d|w)", re.IGNORECASE)
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str) -> timedelta:
    """``30s``, ``30m``, ``12h``, ``7d``, ``2w`` or combinations such as ``1d12h``."""
    s = text.strip().replace(" ", "")
    parts = _AGE.findall(s)
    if not s or "".join(n + u for n, u in parts).lower() != s.lower():
        raise InvalidJobError(
            f"bad age {text!r}: use a number and a unit s/m/h/d/w, e.g. 30m, 12h, 7d"
        )
    return timedelta(seconds=sum(float(n) * _UNIT[u.lower()] for n, u in parts))


@dataclass
class PruneResult:
    """What ``prune`` deleted (or, with ``dry_run``, would delete)."""

    cutoff: datetime
    jobs: int = 0
    edges: int = 0
    workers: int = 0
    #: Finished top-level trees old enough but kept: a live job depends on one of their
    #: jobs, or part of the tree is still live or finished after the cutoff.
    kept: int = 0
    dry_run: bool = False


async def prune(
    q: JobQueue, older_than: timedelta, *, dry_run: bool = False, batch: int = CHUNK
) -> PruneResult:
    """Delete finished jobs that finished more than ``older_than`` ago, keeping the DAG whole.

    The unit of deletion is a top-level job with all its descendants (a container's whole
    tree): it goes only when every job in it is terminal and finished before the cutoff, and
    no live job outside it depends on any of its jobs. A job's edges go with it. Workers not
    seen since the cutoff leave the registry. Each batch of trees is one transaction whose
    rows are locked, so a concurrent retry or a new dependent waits and then sees a
    consistent answer.
    """
    if older_than < timedelta(0):
        raise InvalidJobError(f"older_than must not be negative: {older_than}")
    t, ops = q._t, q._started().db.ops
    J = t.jobs
    cutoff = await now(q) - older_than
    res = PruneResult(cutoff, dry_run=dry_run)
    after = 0

    async def step(conn: AsyncConnection) -> int | None:
        roots = [r[0] for r in await conn.execute(
            select(J.c.id).where(
                J.c.parent_id.is_(None), J.c.state.in_(S.TERMINAL), J.c.finished_at < cutoff,
                J.c.id > after,
            ).order_by(J.c.id).limit(batch)
        )]
        if not roots:
            return None
        tree, bad = await _lock_trees(t, ops, conn, roots, cutoff)
        bad |= await _depended_on(t, conn, tree)
        doomed = sorted(i for i, root in tree.items() if root not in bad)
        res.kept += len(bad)
        res.jobs += len(doomed)
        res.edges += await _delete(t, conn, doomed, dry_run)
        return int(max(roots))

    while True:
        last = await q._write(step)
        if last is None:
            break
        after = last

    W = t.workers

    async def workers(conn: AsyncConnection) -> int:
        if dry_run:
            return int((await conn.execute(
                select(func.count()).select_from(W).where(W.c.last_seen < cutoff))).scalar_one())
        return int((await conn.execute(delete(W).where(W.c.last_seen < cutoff))).rowcount)

    res.workers = await q._write(workers)
    return res


async def _lock_trees(t: S.Tables, ops: DialectOps, conn: AsyncConnection, roots: list[int],
                      cutoff: datetime) -> tuple[dict[int, int], set[int]]:
    """Lock the trees of ``roots``: (each member -> its root, the roots whose tree holds a
    job live or finished after ``cutoff``). Level 0 locks the roots themselves (re-checked
    under the lock), then each level locks the children of the previous one."""
    J = t.jobs
    tree: dict[int, int] = {}
    bad: set[int] = set()
    level, by_id = roots, True
    while level:
        nxt: list[int] = []
        for part in chunks(level):
            col = J.c.id if by_id else J.c.parent_id
            stmt = ops.for_update(
                select(J.c.id, J.c.parent_id, J.c.state, J.c.finished_at)
                .where(col.in_(part)).order_by(J.c.id)
            )
            for r in await conn.execute(stmt):
                root = r.id if by_id else tree[r.parent_id]
                tree[r.id] = root
                if r.state not in S.TERMINAL or r.finished_at is None or (
                    r.finished_at >= cutoff
                ):
                    bad.add(root)
                nxt.append(r.id)
        level, by_id = nxt, False
    return tree, bad


async def _depended_on(t: S.Tables, conn: AsyncConnection, tree: dict[int, int]) -> set[int]:
    """The roots of ``tree`` (member -> root) whose tree a live job depends on."""
    J, D = t.jobs, t.deps
    members = sorted(tree)
    bad: set[int] = set()
    for part in chunks(members):
        rows = await conn.execute(
            select(D.c.depends_on_id).join(J, J.c.id == D.c.job_id)
            .where(D.c.depends_on_id.in_(part), J.c.state.in_(S.LIVE))
        )
        bad.update(tree[r[0]] for r in rows)
    return bad


async def _delete(t: S.Tables, conn: AsyncConnection, doomed: list[int], dry_run: bool) -> int:
    """Delete the jobs ``doomed`` with their edges and tags (``dry_run``: count the edges
    only); how many edges went."""
    J, D = t.jobs, t.deps
    edges = 0
    for part in chunks(doomed):
        if dry_run:
            edges += int((await conn.execute(
                select(func.count()).select_from(D)
                .where(D.c.job_id.in_(part) | D.c.depends_on_id.in_(part))
            )).scalar_one())
            continue
        await delete_tags(conn, t.tags, part)
        r1 = await conn.execute(delete(D).where(D.c.job_id.in_(part)))
        r2 = await conn.execute(delete(D).where(D.c.depends_on_id.in_(part)))
        edges += int(r1.rowcount) + int(r2.rowcount)
        await conn.execute(delete(J).where(J.c.id.in_(part)))
    return edges

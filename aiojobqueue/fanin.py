"""Fan-in through a container: what ``ctx.dependency_results()`` gives for each dependency.

A plain job maps to its result; a container maps to ``{child_id: result}`` of every leaf
it holds, at any depth (nested containers are flattened away, ids stay ints). Read in one
transaction, one statement per level of nesting (a container's children are found by the
``parent_id`` index, so the cost is that of the rows returned)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .database import Database
from .sql import chunks


async def dependency_results(db: Database, conn: AsyncConnection, job_id: int) -> dict[int, Any]:
    """``{dependency id: result}`` of ``job_id``'s dependencies, a container's result being
    the results of its leaves (see the module docstring)."""
    J, D = db.t.jobs, db.t.deps
    rows = (await conn.execute(
        select(J.c.id, J.c.kind, J.c.result).join(D, D.c.depends_on_id == J.c.id)
        .where(D.c.job_id == job_id)
    )).all()
    out: dict[int, Any] = {r.id: r.result for r in rows if r.kind != S.CONTAINER}
    for r in rows:
        if r.kind == S.CONTAINER:
            out[r.id] = await leaf_results(db, conn, r.id)
    return out


async def leaf_results(db: Database, conn: AsyncConnection, container: int) -> dict[int, Any]:
    """``{leaf id: result}`` of every job under ``container``, nested containers included,
    in id order."""
    J = db.t.jobs
    out: dict[int, Any] = {}
    boxes = [container]
    while boxes:
        level: list[int] = []
        for part in chunks(boxes):
            rows = await conn.execute(
                select(J.c.id, J.c.kind, J.c.result)
                .where(J.c.parent_id.in_(part)).order_by(J.c.id)
            )
            for r in rows:
                if r.kind == S.CONTAINER:
                    level.append(r.id)
                else:
                    out[int(r.id)] = r.result
        boxes = level
    return dict(sorted(out.items()))

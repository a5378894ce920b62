"""Run conditions: ``b.add(..., when="failed" | "finished")`` (``"done"``: a plain job).

Event-driven on the ``pending`` counter (schema.py), like every other release:

* a ``finished`` job (kind ALWAYS) counts its unfinished dependencies; one that ends done
  is taken off by the usual release; one that fails or is cancelled is taken off too
  (``soften``, from settle's propagation of failures) instead of cancelling it. It runs
  once the count is 0.
* a ``failed`` job (kind ONFAIL) counts the same, plus HOLD while no dependency has failed
  or been cancelled. The first such end takes HOLD off with its edge (``soften``), so it
  runs once every dependency is terminal. Where every dependency ended done, the usual
  release leaves it at exactly HOLD: ``unmet`` (on the rows every release returns) then
  cancels it, with ``ConditionNotMet``; its ``cancelled_by`` is its own id, which tells
  the roll-up that it does not make its container cancelled.
* A container's cancellation still cancels its children, whatever their condition.

The PostgreSQL one-call finalize declines (to the Python path) where it would release an
ONFAIL row, and a wide fan-out holding one is not split, so these two steps run on every
path. ``retry()`` counts a conditioned job's dependencies as live or not (conditions.count).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .sql import chunks
from .timeutil import db_now

if TYPE_CHECKING:
    from .database import Database
    from .settle import Settler

CONDITIONED = (S.ONFAIL, S.ALWAYS)
UNMET = {"type": "ConditionNotMet",
         "message": "when='failed': every dependency ended done, so it does not run"}


async def soften(settler: Settler, conn: AsyncConnection, edges: dict[int, int]) -> None:
    """Conditioned jobs lose ``edges[id]`` failed or cancelled dependencies (an ONFAIL one
    its HOLD as well); those left with nothing to wait for are released."""
    J = settler.db.t.jobs
    ids = sorted(edges)
    free: list[int] = []
    for part in chunks(ids):
        rows = (await conn.execute(settler.db.ops.for_update(
            select(J.c.id, J.c.kind, J.c.pending)
            .where(J.c.id.in_(part), J.c.state == S.WAITING).order_by(J.c.id)
        ))).all()
        for r in rows:
            n = r.pending - edges[r.id]
            if r.kind == S.ONFAIL and n % S.CREDIT >= S.HOLD:
                n -= S.HOLD
            await conn.execute(update(J).where(J.c.id == r.id).values(pending=n))
            if n <= 0:
                free.append(r.id)
    if free:
        await settler.release(conn, free)


async def unmet(db: Database, conn: AsyncConnection, rows: Sequence[Any]
                ) -> list[tuple[int, str, int | None]]:
    """Among rows a release just returned (locked by this transaction), the ONFAIL jobs left
    waiting on their HOLD alone (every dependency done): cancelled here. Returns them as
    (id, state, parent id), for settle to propagate."""
    cand = sorted(r.id for r in rows if r.kind == S.ONFAIL and r.state == S.WAITING)
    if not cand:
        return []
    J = db.t.jobs
    out: list[tuple[int, str, int | None]] = []
    for part in chunks(cand):
        for r in await conn.execute(select(J.c.id, J.c.pending, J.c.parent_id).where(
                J.c.id.in_(part), J.c.state == S.WAITING)):
            if r.pending == S.HOLD:
                await conn.execute(update(J).where(J.c.id == r.id).values(
                    state=S.CANCELLED, error=UNMET, cancelled_by=r.id, finished_at=db_now(),
                    live_key=None))
                out.append((r.id, S.CANCELLED, r.parent_id))
    return out


async def count(db: Database, conn: AsyncConnection, ids: Sequence[int]) -> dict[int, int]:
    """retry(): the ``pending`` of the conditioned jobs among ``ids`` (their live
    dependencies, plus HOLD for an ONFAIL one none of whose dependencies failed or was
    cancelled), before their container's credit."""
    J, D = db.t.jobs, db.t.deps
    kinds = {r.id: r.kind for r in await conn.execute(
        select(J.c.id, J.c.kind).where(J.c.id.in_(ids), J.c.kind.in_(CONDITIONED)))}
    out = dict.fromkeys(kinds, 0)
    bad: set[int] = set()
    up = J.alias("up")
    for jid, st in await conn.execute(
            select(D.c.job_id, up.c.state).join(up, up.c.id == D.c.depends_on_id)
            .where(D.c.job_id.in_(sorted(kinds)))):
        if st in S.LIVE:
            out[jid] += 1
        elif st != S.DONE:
            bad.add(jid)
    for jid, k in kinds.items():
        if k == S.ONFAIL and jid not in bad:
            out[jid] += S.HOLD
    return out

"""Release: how waiting rows stop waiting on a finished job or an activated container, as
statements (built once; the PostgreSQL routines are built from the same ones) and as the
dialect's ``WritePath``: ``ReturningWrites`` (one UPDATE ... RETURNING per step) or
``LockedWrites`` (lock, read, update: MySQL/MariaDB have no UPDATE ... RETURNING)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from sqlalchemy import and_, case, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .database import Database
from .sql import chunks, lit
from .timeutil import db_now, utcnow_plus

#: how a statement matches a column against the id list it works on
IdsMatch = Callable[[Any], Any]
#: (id, kind, state, parent_id) of rows just unblocked, all locked by this transaction
Unblocked = list[Any]


def unblock(db: Database, pending: Any) -> dict[str, Any]:
    """SET clauses: ``pending`` becomes the new count, and a row left with nothing to wait
    for is released (a job: ready or scheduled, a container: active). Both expressions read
    the row as it was (standard SQL; the single-statement path runs only where that holds)."""
    J = db.t.jobs
    return {
        "pending": pending,
        "state": case(
            (pending > 0, lit(S.WAITING)),
            (J.c.kind == lit(S.CONTAINER), lit(S.ACTIVE)),
            (J.c.kind == lit(S.EXTERNAL_KIND), lit(S.EXTERNAL)),
            (J.c.run_after <= db_now(), lit(S.READY)),
            else_=lit(S.SCHEDULED),
        ),
        **armed(db, pending <= 0),
    }


def armed(db: Database, freed: Any) -> dict[str, Any]:
    """SET clauses of unblock: an external step that stops waiting (``freed``) starts now,
    and its deadline is now + its ``timeout`` (external.py). Every release path (the
    PostgreSQL routines too) is built from unblock, so each arms it the same way."""
    J = db.t.jobs
    ext = and_(freed, J.c.kind == lit(S.EXTERNAL_KIND))
    return {"started_at": case((ext, db_now()), else_=J.c.started_at),
            "lease_expires": case((ext, utcnow_plus(J.c.timeout)), else_=J.c.lease_expires)}


def unblocked_columns(db: Database, wakes: bool = True) -> list[Any]:
    """RETURNING of the unblocking statements; where the dialect can (and ``wakes``), a
    row that became ready sends the wake-up from inside the statement (no extra round
    trip; PostgreSQL collapses the repeats of one transaction into one notification)."""
    J = db.t.jobs
    cols: list[Any] = [J.c.id, J.c.kind, J.c.state, J.c.parent_id]
    wake = db.ops.notify_expr() if wakes else None
    if wake is not None:
        cols.append(case((J.c.state == lit(S.READY), wake)).label("wake"))
    return cols


def drop_deps_stmt(db: Database, ids: IdsMatch | None = None, wake: bool = True) -> Any:
    """One statement: count the edges from the finished ids (read now, after their rows
    were locked and updated), take that many off each waiting dependent, release those
    left with none; RETURNING every row it changed (all now locked by us). ``ids``:
    how the finished ids are matched (default: the bind parameter ``ids``); ``wake``:
    the RETURNING sends the wake-up where the dialect can."""
    J, D = db.t.jobs, db.t.deps
    match = ids or (lambda col: db.ops.in_ids_param(col, "ids"))
    # The edge look-up stays an index scan on depends_on_id (see DialectOps.materialized):
    # grouped in line, PostgreSQL's generic plan may walk the whole deps key when skewed.
    e = db.ops.materialized(select(D.c.job_id).where(match(D.c.depends_on_id)).cte("e"))
    c = select(e.c.job_id, func.count().label("n")).group_by(e.c.job_id).cte("c")
    return (update(J).where(db.ops.in_select(J.c.id, select(e.c.job_id)),
                            J.c.id == c.c.job_id, J.c.state == lit(S.WAITING))
            .values(**unblock(db, J.c.pending - c.c.n))
            .returning(*unblocked_columns(db, wake)))


def drop_one_stmt(db: Database, ids: IdsMatch) -> Any:
    """The waiting jobs among ``ids`` each stop waiting on one finished upstream (the
    split release's: each has one edge to it); RETURNING every row it changed."""
    J = db.t.jobs
    return (update(J).where(ids(J.c.id), J.c.state == lit(S.WAITING))
            .values(**unblock(db, J.c.pending - 1))
            .returning(*unblocked_columns(db, False)))


def drop_kids_stmt(db: Database, ids: IdsMatch | None = None, wake: bool = True) -> Any:
    """One statement: the waiting children of containers that just became active stop
    waiting on them; RETURNING every row it changed. ``ids``, ``wake``: as for
    drop_deps_stmt (the containers' ids match ``parent_id``)."""
    J = db.t.jobs
    match = ids or (lambda col: db.ops.in_ids_param(col, "ids"))
    return (update(J).where(match(J.c.parent_id),
                            J.c.state == lit(S.WAITING), J.c.pending >= S.CREDIT)
            .values(**unblock(db, J.c.pending - S.CREDIT))
            .returning(*unblocked_columns(db, wake)))


class _Row(NamedTuple):
    id: int
    kind: str
    state: str
    parent_id: int | None


async def release_locked(db: Database, conn: AsyncConnection, ids: Sequence[int]) -> Unblocked:
    """Portable path: lock the waiting rows among ``ids`` and release those that wait on
    nothing. Returns (id, kind, state, parent_id) of the locked rows, as now."""
    J = db.t.jobs
    rows: list[Any] = []
    for part in chunks(ids):
        rows += (await conn.execute(db.ops.for_update(
            select(J.c.id, J.c.kind, J.c.pending, J.c.parent_id)
            .where(J.c.id.in_(part), J.c.state == lit(S.WAITING))
            .order_by(J.c.id)
        ))).all()
    free = [r.id for r in rows if r.pending <= 0]
    for part in chunks(free):
        await conn.execute(
            update(J).where(J.c.id.in_(part), J.c.state == lit(S.WAITING))
            .values(**unblock(db, J.c.pending))
        )
    if any(r.pending <= 0 and r.kind == S.JOB for r in rows):
        await db.ops.notify(conn)
    # READY stands for "ready or scheduled" here (the rows are only told apart as live).
    return [_Row(r.id, r.kind, S.WAITING if r.pending > 0 else
                 S.ACTIVE if r.kind == S.CONTAINER else S.EXTERNAL
                 if r.kind == S.EXTERNAL_KIND else S.READY, r.parent_id) for r in rows]


class ReturningWrites:
    """Finalize and release by UPDATE ... RETURNING: what the next step needs comes back
    with the change (PostgreSQL, SQLite)."""

    #: plain successes come back from their UPDATE (else: Finalizer.finish_counted)
    returns_rows = True

    def __init__(self, db: Database, release_call: Any = None) -> None:
        self.db = db
        #: the release routine's call where installed (the same statement, planned safely)
        self.release_call = release_call

    async def finish_plain(self, conn: AsyncConnection, plain: Sequence[Any],
                           finish: Callable[..., Any]) -> list[tuple[Any, int]] | None:
        """Plain successes (no result) by ``finish`` (finalize's fenced UPDATE ...
        RETURNING), or None where they must take the lock-and-read path."""
        return list(await finish(conn, plain, alone=False))

    async def drop_deps(self, conn: AsyncConnection, done: Sequence[int]) -> Unblocked:
        """Dependents of the ``done`` ids stop waiting on them."""
        stmt = self.release_call
        if stmt is None:
            stmt = self.db.stmt("settle.drop_deps", lambda: drop_deps_stmt(self.db))
        rows: list[Any] = []
        for part in chunks(done):
            rows += (await conn.execute(stmt, {"ids": part})).all()
        return rows

    async def drop_kids(self, conn: AsyncConnection, boxes: Sequence[int]) -> Unblocked:
        """Children of the just activated containers ``boxes`` stop waiting on them."""
        stmt = self.db.stmt("settle.drop_kids", lambda: drop_kids_stmt(self.db))
        rows: list[Any] = []
        for part in chunks(boxes):
            rows += (await conn.execute(stmt, {"ids": part})).all()
        return rows


class LockedWrites:
    """Finalize and release without UPDATE ... RETURNING: lock the rows, read, update
    (MySQL, MariaDB)."""

    returns_rows = False

    def __init__(self, db: Database, release_call: Any = None) -> None:
        self.db = db

    async def finish_plain(self, conn: AsyncConnection, plain: Sequence[Any],
                           finish: Callable[..., Any]) -> list[tuple[Any, int]] | None:
        return None

    async def drop_deps(self, conn: AsyncConnection, done: Sequence[int]) -> Unblocked:
        db = self.db
        J, D = db.t.jobs, db.t.deps
        counts: dict[int, int] = defaultdict(int)
        for part in chunks(done):
            # No GROUP BY: counted here. Grouped, PostgreSQL's generic plan walks the whole
            # deps primary key when the table is skewed (many jobs waiting on one upstream).
            edges = await conn.execute(
                select(D.c.job_id)
                .where(db.ops.in_ids(D.c.depends_on_id, part))
            )
            for (jid,) in edges:
                counts[jid] += 1
        if not counts:
            return []
        by_n: dict[int, list[int]] = defaultdict(list)
        for jid, n in counts.items():
            by_n[n].append(jid)
        for n, ids in by_n.items():
            ids.sort()
            for part in chunks(ids):
                await conn.execute(
                    update(J).where(J.c.id.in_(part), J.c.state == lit(S.WAITING))
                    .values(pending=J.c.pending - n)
                )
        return await release_locked(db, conn, sorted(counts))

    async def drop_kids(self, conn: AsyncConnection, boxes: Sequence[int]) -> Unblocked:
        db = self.db
        J = db.t.jobs
        kids = await conn.execute(db.ops.for_update(
            select(J.c.id).where(J.c.parent_id.in_(boxes), J.c.state == lit(S.WAITING),
                                 J.c.pending >= S.CREDIT).order_by(J.c.id)
        ))
        ids = sorted(r[0] for r in kids)
        for part in chunks(ids):
            await conn.execute(
                update(J).where(J.c.id.in_(part))
                .values(pending=J.c.pending - S.CREDIT)
            )
        return await release_locked(db, conn, ids)


WritePath = ReturningWrites | LockedWrites

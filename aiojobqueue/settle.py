"""Settle: what follows when jobs become terminal, inside the finalize's transaction.

Dependents of a done job stop waiting on it (and run once nothing else holds them);
containers that this makes active release their children in turn; a container whose last
child ended rolls up (done, or failed/cancelled after its children); a failed or cancelled
job cancels everything that waits on it. How rows are changed is the dialect's
``WritePath``: ``ReturningWrites`` (one UPDATE ... RETURNING per step) or ``LockedWrites``
(lock, read, update: MySQL/MariaDB have no UPDATE ... RETURNING).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from sqlalchemy import bindparam, case, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .database import Database
from .sql import lit
from .timeutil import db_now

CHUNK = 1000
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
            (J.c.run_after <= db_now(), lit(S.READY)),
            else_=lit(S.SCHEDULED),
        ),
    }


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
    for i in range(0, len(ids), CHUNK):
        rows += (await conn.execute(db.ops.for_update(
            select(J.c.id, J.c.kind, J.c.pending, J.c.parent_id)
            .where(J.c.id.in_(ids[i : i + CHUNK]), J.c.state == lit(S.WAITING))
            .order_by(J.c.id)
        ))).all()
    free = [r.id for r in rows if r.pending <= 0]
    for i in range(0, len(free), CHUNK):
        await conn.execute(
            update(J).where(J.c.id.in_(free[i : i + CHUNK]), J.c.state == lit(S.WAITING))
            .values(**unblock(db, J.c.pending))
        )
    if any(r.pending <= 0 and r.kind != S.CONTAINER for r in rows):
        await db.ops.notify(conn)
    # READY stands for "ready or scheduled" here (the rows are only told apart as live).
    return [_Row(r.id, r.kind, S.WAITING if r.pending > 0 else
                 S.ACTIVE if r.kind == S.CONTAINER else S.READY, r.parent_id) for r in rows]


class ReturningWrites:
    """Finalize and release by UPDATE ... RETURNING: what the next step needs comes back
    with the change (PostgreSQL, SQLite)."""

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
        for i in range(0, len(done), CHUNK):
            rows += (await conn.execute(stmt, {"ids": done[i : i + CHUNK]})).all()
        return rows

    async def drop_kids(self, conn: AsyncConnection, boxes: Sequence[int]) -> Unblocked:
        """Children of the just activated containers ``boxes`` stop waiting on them."""
        stmt = self.db.stmt("settle.drop_kids", lambda: drop_kids_stmt(self.db))
        rows: list[Any] = []
        for i in range(0, len(boxes), CHUNK):
            rows += (await conn.execute(stmt, {"ids": boxes[i : i + CHUNK]})).all()
        return rows


class LockedWrites:
    """Finalize and release without UPDATE ... RETURNING: lock the rows, read, update
    (MySQL, MariaDB)."""

    def __init__(self, db: Database, release_call: Any = None) -> None:
        self.db = db

    async def finish_plain(self, conn: AsyncConnection, plain: Sequence[Any],
                           finish: Callable[..., Any]) -> list[tuple[Any, int]] | None:
        return None

    async def drop_deps(self, conn: AsyncConnection, done: Sequence[int]) -> Unblocked:
        db = self.db
        J, D = db.t.jobs, db.t.deps
        counts: dict[int, int] = defaultdict(int)
        for i in range(0, len(done), CHUNK):
            # No GROUP BY: counted here. Grouped, PostgreSQL's generic plan walks the whole
            # deps primary key when the table is skewed (many jobs waiting on one upstream).
            edges = await conn.execute(
                select(D.c.job_id)
                .where(db.ops.in_ids(D.c.depends_on_id, done[i : i + CHUNK]))
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
            for i in range(0, len(ids), CHUNK):
                await conn.execute(
                    update(J).where(J.c.id.in_(ids[i : i + CHUNK]), J.c.state == lit(S.WAITING))
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
        for i in range(0, len(ids), CHUNK):
            await conn.execute(
                update(J).where(J.c.id.in_(ids[i : i + CHUNK]))
                .values(pending=J.c.pending - S.CREDIT)
            )
        return await release_locked(db, conn, ids)


WritePath = ReturningWrites | LockedWrites


def cancel_error(cause: int | None, cause_state: str | None = None) -> dict[str, Any]:
    """The error of a job cancelled by request (``cause`` None) or by its upstream."""
    if cause is None:
        return {"type": "Cancelled", "message": "cancelled by request"}
    verb = "cancelled" if cause_state == S.CANCELLED else "failed"
    return {"type": "UpstreamFailed", "message": f"upstream {cause} {verb}"}


class Settler:
    """Propagation and roll-up (see the module docstring), on the caller's transaction."""

    def __init__(self, db: Database, path: WritePath) -> None:
        self.db = db
        self.path = path
        self.J = db.t.jobs
        self.D = db.t.deps

    async def settle(
        self,
        conn: AsyncConnection,
        finished: Iterable[tuple[int, str]],
        parents: dict[int, int | None] | None = None,
        leaves: set[int] | None = None,
    ) -> None:
        """Propagate jobs that just became terminal: release or cancel dependents, roll up.

        ``parents`` maps finished ids to their parent id when the caller read them already
        (finish() does, under the row lock): those need no look-up here; ``leaves`` are
        finished ids known to have no dependents (read while their rows were locked)."""
        work = list(finished)
        while work:
            done = [i for i, st in work if st == S.DONE and not (leaves and i in leaves)]
            bad = {i: i for i, st in work if st != S.DONE}
            newly: list[tuple[int, str, int | None]] = []  # containers finished, parent
            # Containers with a live child job that this transaction holds locked: none of
            # their children can be the last to finish before we commit, so their roll-up
            # (a lock and a probe) is skipped; whoever finishes that child rolls up.
            busy: set[int] = set()
            if done:
                more, busy = await self._release_dependents(conn, done)
                newly += more
            if bad:
                cancelled = await self._cancel_downstream(conn, bad)
                work = work + [(i, S.CANCELLED) for i in cancelled]
                busy.clear()  # a witness may have been cancelled just now
            known = parents or {}
            ups = await self._parents_of(conn, [i for i, _ in work if i not in known])
            ups = sorted({*ups, *(p for i, _ in work if (p := known.get(i)) is not None)})
            newly += await self._rollup(conn, [c for c in ups if c not in busy])
            work = [(i, st) for i, st, _ in newly]
            parents, leaves = {i: p for i, _, p in newly}, None

    async def _parents_of(self, conn: AsyncConnection, ids: Sequence[int]) -> list[int]:
        J = self.J
        out: set[int] = set()
        for i in range(0, len(ids), CHUNK):
            rows = await conn.execute(
                select(J.c.parent_id).where(self.db.ops.in_ids(J.c.id, ids[i : i + CHUNK]),
                                            J.c.parent_id.is_not(None)).distinct()
            )
            out.update(r[0] for r in rows)
        return sorted(out)

    async def _release_dependents(
        self, conn: AsyncConnection, done: Sequence[int]
    ) -> tuple[list[tuple[int, str, int | None]], set[int]]:
        """Unblock what waits on the ``done`` ids. Returns the containers that finished by
        it (with their parent) and the containers that hold a live child job this
        transaction has locked."""
        return await self._released(conn, await self.path.drop_deps(conn, done))

    async def _released(
        self, conn: AsyncConnection, rows: list[Any]
    ) -> tuple[list[tuple[int, str, int | None]], set[int]]:
        """Follow up rows just unblocked (``rows``: id, kind, state, parent_id, all locked by
        this transaction): containers that became active release their children in turn, and
        the empty ones finish. Returns (containers finished, containers with a live child job
        that we hold locked)."""
        finished: list[tuple[int, str, int | None]] = []
        busy: set[int] = set()
        any_ready = False
        while rows:
            boxes: list[int] = []
            for r in rows:
                if r.kind == S.CONTAINER:
                    if r.state == S.ACTIVE:
                        boxes.append(r.id)
                else:
                    any_ready = any_ready or r.state == S.READY
                    if r.parent_id is not None:
                        busy.add(r.parent_id)  # a live job row we hold: a safe witness
            rows = []
            if not boxes:
                break
            boxes.sort()
            rows = await self.path.drop_kids(conn, boxes)
            # the empty ones finish now; a box with a child job released above is not empty
            kid_jobs = {r.parent_id for r in rows if r.kind != S.CONTAINER}
            finished += await self._rollup(conn, [b for b in boxes if b not in kid_jobs])
        if any_ready and self.db.ops.notify_expr() is None:
            await self.db.ops.notify(conn)
        return finished, busy

    async def release(self, conn: AsyncConnection, ids: Sequence[int]) -> list[tuple[int, str]]:
        """Jobs among ``ids`` that wait on nothing any more become runnable (containers:
        active, and their children are released in turn). Returns containers finished by it."""
        finished, _ = await self._released(conn, await release_locked(self.db, conn, sorted(ids)))
        return [(i, st) for i, st, _ in finished]

    async def _cancel_downstream(self, conn: AsyncConnection, roots: dict[int, int]) -> list[int]:
        """Cancel everything that waits on ``roots`` (id -> root cause). Running jobs get a
        cancel request their worker honours; the rest are cancelled here. Returns the ids
        cancelled here."""
        J, D = self.J, self.D
        frontier = dict(roots)
        out: list[int] = []
        cause_state: dict[int, str] = {}
        while frontier:
            ids = sorted(frontier)
            hits: dict[int, int] = {}
            for i in range(0, len(ids), CHUNK):
                part = ids[i : i + CHUNK]
                rows = await conn.execute(
                    select(D.c.job_id, D.c.depends_on_id).join(J, J.c.id == D.c.job_id)
                    .where(D.c.depends_on_id.in_(part), J.c.state.in_(S.LIVE))
                )
                for jid, up in rows:
                    hits.setdefault(jid, frontier[up])
                rows = await conn.execute(
                    select(J.c.id, J.c.parent_id).where(J.c.parent_id.in_(part),
                                                        J.c.state.in_(S.LIVE))
                )
                for jid, up in rows:
                    hits.setdefault(jid, frontier[up])
            if not hits:
                break
            for c in set(hits.values()) - set(cause_state):
                cause_state[c] = (await conn.execute(
                    select(J.c.state).where(J.c.id == c))).scalar_one()
            frontier = {}
            by_cause: dict[int, list[int]] = defaultdict(list)
            for jid, c in hits.items():
                by_cause[c].append(jid)
            for c, jids in by_cause.items():
                jids.sort()
                err = cancel_error(c, cause_state[c])
                for i in range(0, len(jids), CHUNK):
                    part = jids[i : i + CHUNK]
                    await conn.execute(
                        update(J).where(J.c.id.in_(part), J.c.state == lit(S.RUNNING))
                        .values(cancel_requested=True, cancelled_by=c)
                    )
                    stmt = select(J.c.id).where(
                        J.c.id.in_(part), J.c.state.in_([S.WAITING, S.SCHEDULED, S.READY, S.ACTIVE])
                    )
                    victims = [r[0] for r in await conn.execute(self.db.ops.for_update(stmt))]
                    if victims:
                        await conn.execute(
                            update(J).where(J.c.id.in_(victims)).values(
                                state=S.CANCELLED, error=err, cancelled_by=c,
                                finished_at=db_now(), live_key=None,
                            )
                        )
                        out += victims
                        frontier.update({v: c for v in victims})
        return out

    async def rollup(
        self, conn: AsyncConnection, containers: Sequence[int]
    ) -> list[tuple[int, str]]:
        """Finish each container whose children are all terminal. The container rows are
        locked first, so two last children finishing at once cannot both miss the roll-up."""
        return [(cid, st) for cid, st, _ in await self._rollup(conn, containers)]

    async def _rollup(
        self, conn: AsyncConnection, containers: Sequence[int]
    ) -> list[tuple[int, str, int | None]]:
        """``rollup()``, with each finished container's parent id (read with its lock, so
        settle() needs no look-up for it)."""
        J = self.J
        if not containers:
            return []
        lock = self.db.stmt("rollup.lock", lambda: self.db.ops.for_update(
            select(J.c.id, J.c.state, J.c.parent_id)
            .where(self.db.ops.in_ids_param(J.c.id, "ids")).order_by(J.c.id)))
        ids = sorted(set(containers))
        open_: list[Any] = []
        for i in range(0, len(ids), CHUNK):
            rows = await conn.execute(lock, {"ids": ids[i : i + CHUNK]})
            open_ += [r for r in rows if r.state not in S.TERMINAL]
        # Read after the locks are held: a child finished by a transaction that held the lock
        # before us is seen. One statement per container: while a child is live (the common
        # case) it is one index probe and nothing is counted (the counts' uncorrelated NOT
        # EXISTS is a one-time filter), so n children cost O(n) over the container's life.
        def census() -> Any:
            live = select(J.c.id).where(J.c.parent_id == bindparam("c"),
                                        J.c.state.in_([lit(x) for x in S.LIVE]))

            def n(state: str) -> Any:
                return (select(func.count()).where(J.c.parent_id == bindparam("c"),
                                                   J.c.state == lit(state), ~live.exists())
                        .scalar_subquery())
            return select(live.exists().label("live"), n(S.FAILED).label("failed"),
                          n(S.CANCELLED).label("cancelled"))
        counter = self.db.stmt("rollup.census", census)
        out: list[tuple[int, str, int | None]] = []
        for r in open_:
            c = (await conn.execute(counter, {"c": r.id})).one()
            if c.live:
                continue
            counts = {S.FAILED: c.failed, S.CANCELLED: c.cancelled}
            if counts.get(S.FAILED):
                state, err = S.FAILED, {"type": "ChildFailed",
                                        "message": f"{counts[S.FAILED]} child job(s) failed"}
            elif counts.get(S.CANCELLED):
                n = counts[S.CANCELLED]
                state, err = S.CANCELLED, {"type": "ChildCancelled",
                                           "message": f"{n} child job(s) cancelled"}
            else:
                state, err = S.DONE, None
            await conn.execute(
                update(J).where(J.c.id == r.id, J.c.state.in_(S.LIVE)).values(
                    state=state, error=err, finished_at=db_now(), live_key=None
                )
            )
            out.append((r.id, state, r.parent_id))
        return out

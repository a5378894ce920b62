"""Settle: what follows when jobs become terminal, inside the finalize's transaction.

Dependents of a done job stop waiting on it (and run once nothing else holds them);
containers that this makes active release their children in turn; a container whose last
child ended rolls up (done, or failed/cancelled after its children); a failed or cancelled
job cancels everything that waits on it. How waiting rows are released is the dialect's
``WritePath`` (release.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from . import conditions
from . import schema as S
from .database import Database
from .release import WritePath, release_locked
from .sql import chunks, lit
from .timeutil import db_now


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
        for part in chunks(ids):
            rows = await conn.execute(
                select(J.c.parent_id).where(self.db.ops.in_ids(J.c.id, part),
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
            # a when="failed" job whose every dependency ended done (conditions.py)
            finished += await conditions.unmet(self.db, conn, rows)
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
        J = self.J
        frontier = dict(roots)
        out: list[int] = []
        cause_state: dict[int, str] = {}
        # run conditions: failed/cancelled edges into when="failed"/"finished" jobs, which
        # are not cancelled (conditions.py)
        soft: dict[int, int] = defaultdict(int)
        while frontier:
            hits = await self._waiting_on(conn, frontier, soft)
            if not hits:
                break
            for c in set(hits.values()) - set(cause_state):
                cause_state[c] = (await conn.execute(
                    select(J.c.state).where(J.c.id == c))).scalar_one()
            frontier = await self._cancel_hits(conn, hits, cause_state)
            out += list(frontier)
        if soft:
            await conditions.soften(self, conn, soft)
        return out

    async def _waiting_on(
        self, conn: AsyncConnection, frontier: dict[int, int], soft: dict[int, int]
    ) -> dict[int, int]:
        """The live jobs that wait on the ``frontier`` ids (id -> root cause) by an edge or
        as their children, each with its root cause. Edges into conditioned jobs do not
        cancel them: they are counted in ``soft`` instead (job id -> edges)."""
        J, D = self.J, self.D
        ids = sorted(frontier)
        hits: dict[int, int] = {}
        for part in chunks(ids):
            rows = await conn.execute(
                select(D.c.job_id, D.c.depends_on_id, J.c.kind).join(J, J.c.id == D.c.job_id)
                .where(D.c.depends_on_id.in_(part), J.c.state.in_(S.LIVE))
            )
            for jid, up, kind in rows:
                if kind in conditions.CONDITIONED:
                    soft[jid] += 1
                else:
                    hits.setdefault(jid, frontier[up])
            kids = await conn.execute(
                select(J.c.id, J.c.parent_id).where(J.c.parent_id.in_(part),
                                                    J.c.state.in_(S.LIVE))
            )
            for jid, up in kids:
                hits.setdefault(jid, frontier[up])
        return hits

    async def _cancel_hits(
        self, conn: AsyncConnection, hits: dict[int, int], cause_state: dict[int, str]
    ) -> dict[int, int]:
        """Cancel the jobs ``hits`` (id -> root cause, whose state is in ``cause_state``),
        by cause: those leased get a cancel request, those not started yet are cancelled
        here. Returns the ones cancelled here, in order, with their root cause."""
        J = self.J
        cancelled: dict[int, int] = {}
        by_cause: dict[int, list[int]] = defaultdict(list)
        for jid, c in hits.items():
            by_cause[c].append(jid)
        for c, jids in by_cause.items():
            jids.sort()
            err = cancel_error(c, cause_state[c])
            for part in chunks(jids):
                await conn.execute(
                    update(J).where(J.c.id.in_(part),
                                   J.c.state.in_([lit(x) for x in S.LEASED_STATES]))
                    .values(cancel_requested=True, cancelled_by=c)
                )
                stmt = select(J.c.id).where(
                    J.c.id.in_(part),
                    J.c.state.in_([S.WAITING, S.SCHEDULED, S.READY, S.ACTIVE, S.EXTERNAL])
                )
                victims = [r[0] for r in await conn.execute(self.db.ops.for_update(stmt))]
                if victims:
                    await conn.execute(
                        update(J).where(J.c.id.in_(victims)).values(
                            state=S.CANCELLED, error=err, cancelled_by=c,
                            finished_at=db_now(), live_key=None,
                        )
                    )
                    cancelled.update({v: c for v in victims})
        return cancelled

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
        for part in chunks(ids):
            rows = await conn.execute(lock, {"ids": part})
            open_ += [r for r in rows if r.state not in S.TERMINAL]
        # Read after the locks are held: a child finished by a transaction that held the lock
        # before us is seen. One statement per container: while a child is live (the common
        # case) it is one index probe and nothing is counted (the counts' uncorrelated NOT
        # EXISTS is a one-time filter), so n children cost O(n) over the container's life.
        def census() -> Any:
            live = select(J.c.id).where(J.c.parent_id == bindparam("c"),
                                        J.c.state.in_([lit(x) for x in S.LIVE]))

            def n(state: str) -> Any:
                # a when="failed" child whose condition did not hold (cancelled_by = its own
                # id: conditions.unmet) does not make its container cancelled
                return (select(func.count()).where(J.c.parent_id == bindparam("c"),
                                                   J.c.state == lit(state), ~live.exists(),
                                                   J.c.cancelled_by.is_distinct_from(J.c.id))
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

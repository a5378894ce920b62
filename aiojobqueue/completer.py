"""Fenced finalize, container roll-up, release of dependents and failure propagation.

Every function here runs inside the caller's write transaction, so a finalize and all of its
consequences commit together or not at all.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import (
    and_,
    bindparam,
    case,
    delete,
    false,
    func,
    literal_column,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from . import history
from . import schema as S
from .policy import backoff
from .timeutil import db_now, utcnow_plus

if TYPE_CHECKING:
    from .claim import LeaseAsk
    from .queue import JobQueue

log = logging.getLogger("aiojobqueue.completer")
CHUNK = 1000
#: The finalize call of a job that many jobs wait on releases this many of them (4x what it
#: leases along, where that is more), the rest right after in calls of their own
#: (PostgreSQL; see PostgresOps.settle_routine). Fewer dependents are released at once.
SPLIT = 128
#: The rest of a split release is recorded (and released) in parts of at most this many jobs,
#: each its own transaction, so the first part is runnable before the last is written.
PART = 256
#: how a statement matches a column against the id list it works on
IdsMatch = Callable[[Any], Any]


def lit(state: str) -> Any:
    """A state as a SQL literal: keeps PostgreSQL's generic plans on the partial indexes."""
    return literal_column(f"'{state}'")


@dataclass(frozen=True)
class Outcome:
    """How one attempt ended. ``kind``: done | failed | cancelled | released.

    ``finish_detailed()`` returns the outcomes that took effect with ``kind`` set to what
    actually happened: ``retry`` (failed, will run again after ``retry_in`` seconds) or ``failed``
    (for good); ``cancelled`` also when a failure met a cancel request."""

    job_id: int
    attempt: int
    owner: str
    kind: str
    result: Any = None
    error: dict[str, Any] | None = None
    #: False: fail for good now (e.g. non-retryable), regardless of attempts left.
    retryable: bool = True
    #: Set by finish_detailed() on a ``retry``: the backoff delay in seconds.
    retry_in: float | None = None


class Completer:
    def __init__(self, q: JobQueue) -> None:
        self.q = q
        self.J = q._t.jobs
        self.D = q._t.deps

    # -- finalize -------------------------------------------------------------------------
    async def finish(self, conn: AsyncConnection, outcomes: Sequence[Outcome]) -> list[Outcome]:
        """Apply ``outcomes``, each only if its worker still holds that attempt's lease.

        Returns the outcomes that took effect, as given; the others were fenced out (the
        lease expired and the job was reclaimed, or it was cancelled) and changed nothing.
        """
        took = {(o.job_id, o.attempt) for o in await self.finish_detailed(conn, outcomes)}
        return [o for o in outcomes if (o.job_id, o.attempt) in took]

    async def finish_fast(
        self, conn: AsyncConnection, outcomes: Sequence[Outcome]
    ) -> set[tuple[int, int]]:
        """Finish ``done`` outcomes of jobs that no edge waits on and no container holds with
        one fenced UPDATE ... RETURNING per attempt number (usually one): nothing else changes
        when such a job ends, so this statement alone is the whole finalize and may run in
        autocommit. Returns the (id, attempt) pairs it finished; the caller sends the rest
        (fenced out here, or given an edge meanwhile) through finish_detailed().

        Safe against an edge added concurrently: batch.insert_specs sets ``has_dependents``
        under the upstream's row lock, and an UPDATE that waited for that lock re-checks its
        WHERE on the new row version (READ COMMITTED), so it then skips the row."""
        return {(r.id, a) for r, a in await self._finish_plain(conn, outcomes, alone=True)}

    async def _finish_plain(
        self, conn: AsyncConnection, outcomes: Sequence[Outcome], alone: bool
    ) -> list[tuple[Any, int]]:
        """Successes without a result, fenced (state, attempt, lease owner) and applied by one
        UPDATE ... RETURNING per (attempt, owner): no lock-and-read first. ``alone``: only
        jobs with no parent and no dependents (nothing else to do). Returns (row: id,
        parent_id, has_dependents as updated, attempt); the row values are those of the
        version updated, so an edge committed while the UPDATE waited for the row shows."""
        stmt = self._stmt("finish.alone" if alone else "finish.plain",
                          lambda: self._plain_stmt(alone))
        out: list[tuple[Any, int]] = []
        for (a, owner), group in _by_attempt(outcomes):
            assert all(o.result is None for o in group)
            ids = [o.job_id for o in group]
            for i in range(0, len(ids), CHUNK):
                rows = await conn.execute(stmt, {"ids": ids[i : i + CHUNK], "a": a, "o": owner})
                out += [(r, a) for r in rows]
        return out

    def _plain_stmt(self, alone: bool, ids: IdsMatch | None = None, attempt: Any = None,
                    owner: Any = None, result: Any = None) -> Any:
        """The fenced UPDATE of _finish_plain; by default its ids, attempt and owner are bind
        parameters ``ids``, ``a``, ``o`` and it stores no result (other expressions: the
        server-side routine's)."""
        J = self.J
        match = ids or (lambda col: self.q._ops.in_ids_param(col, "ids"))
        cond = [match(J.c.id), J.c.state == lit(S.RUNNING),
                J.c.attempts == (bindparam("a") if attempt is None else attempt),
                J.c.lease_owner == (bindparam("o") if owner is None else owner)]
        if alone:
            cond += [J.c.has_dependents == false(), J.c.parent_id.is_(None)]
        return (
            update(J).where(*cond)
            .values(state=S.DONE, result=result, error=None, finished_at=db_now(),
                    live_key=None, lease_owner=None, lease_expires=None)
            .returning(J.c.id, J.c.parent_id, J.c.has_dependents)
        )

    async def finish_in_one_call(
        self, conn: AsyncConnection, outcomes: Sequence[Outcome], ask: LeaseAsk | None = None,
    ) -> set[tuple[int, int]]:
        """Finish ``done`` outcomes by one call of the server-side routine (PostgreSQL, see
        PostgresOps.settle_routine) per attempt number: the fenced UPDATE (storing the
        results), then the release of their dependents in a statement of its own (a fresh
        snapshot, taken while this call holds the finished rows locked), all atomic, so it
        may run in autocommit. It also activates the containers that this releases and
        rolls up the containers whose last child this was (and so on up and along the
        graph), like settle(); it declines (changing nothing) where a child failed or was
        cancelled (cancellations to propagate), where an activated container holds another
        container or may be empty: those, and the fenced-out ones, are not in the returned
        (id, attempt) pairs and go through finish_detailed().

        ``ask``: a claim for the last call to make once it has settled (see LeaseAsk); its
        ``rows`` are set to what it leased, unless that call declined."""
        q = self.q
        stmt = q._settle_call
        assert stmt is not None
        calls: list[tuple[int, dict[str, Any]]] = []
        for (a, owner), group in _by_attempt(outcomes):
            for i in range(0, len(group), CHUNK):
                part = group[i : i + CHUNK]
                results = [o.result for o in part]
                calls.append((a, {"ids": [o.job_id for o in part], "a": a, "o": owner,
                                  "r": json.dumps(results) if any(r is not None for r in results)
                                  else None, "g": None, "types": None, "n": 0, "lo": None,
                                  "ttl": None}))
        if ask is not None and calls:
            calls[-1][1].update(g=ask.group, types=ask.types, n=ask.n, lo=q.worker_id,
                                ttl=q.lease_ttl)
        took: set[tuple[int, int]] = set()
        for a, params in calls:
            done, leased, rest = (await conn.execute(stmt, params)).one()
            took.update((j, a) for j in done or ())
            if ask is not None and params["n"] and done is not None:
                ask.rows = leased
            if rest is not None:
                q._release_rest()
        return took

    def settle_routine(self) -> tuple[str, list[str]] | None:
        """(name, DDL) of the routines behind finish_in_one_call(), built from the very
        statements finish_detailed() runs; None where the dialect has no such routine."""
        from .claim import lease_values, pick_and_lease_stmt  # (claim imports this module)

        q = self.q
        return q._ops.settle_routine(
            lambda ids, a, o, r: self._plain_stmt(False, ids, a, o, r),
            lambda ids: self._drop_deps_stmt(ids, wake=False),
            lambda ids: self._drop_kids_stmt(ids, wake=False),
            lambda g, n, of_types, owner, ttl: pick_and_lease_stmt(
                q, g, n, of_types, lease_values(q, ttl=ttl, owner=owner)),
            self._drop_one_stmt, q._split, PART,
        )

    async def finish_detailed(
        self, conn: AsyncConnection, outcomes: Sequence[Outcome]
    ) -> list[Outcome]:
        """``finish()``, returning what actually happened to each applied outcome: ``kind``
        becomes ``retry`` (with ``retry_in``) or ``failed`` for a failure, ``cancelled`` for
        a failure that met a cancel request (for hooks and logs)."""
        J = self.J
        if not outcomes:
            return []
        finished: list[tuple[int, str]] = []
        hint: dict[int, int | None] = {}
        leaves: set[int] = set()
        effective: list[Outcome] = []  # what actually happened, for hooks and logs
        if self.q._ops.update_returning:
            # Plain successes need none of the lock-and-read below (no retry, cancel or result
            # to decide): one UPDATE ... RETURNING each; what settle() needs comes back with it.
            plain = [o for o in outcomes if o.kind == "done" and o.result is None]
            if plain:
                took = set()
                for r, a in await self._finish_plain(conn, plain, alone=False):
                    took.add((r.id, a))
                    finished.append((r.id, S.DONE))
                    hint[r.id] = r.parent_id
                    if not r.has_dependents:
                        leaves.add(r.id)
                effective += [o for o in plain if (o.job_id, o.attempt) in took]
                outcomes = [o for o in outcomes if not (o.kind == "done" and o.result is None)]
        by_key = {(o.job_id, o.attempt): o for o in outcomes}
        held: dict[int, Any] = {}
        ids = sorted({o.job_id for o in outcomes})
        # parent_id comes with the lock (it never changes), so settle() need not look it up.
        # Dependents are NOT read here: an edge committed while we waited for the row lock
        # would be invisible to this statement's snapshot (PostgreSQL, READ COMMITTED).
        stmts = self.q._stmts
        lock = stmts.get("finish.lock")
        if lock is None:
            lock = stmts["finish.lock"] = self.q._ops.for_update(
                select(J.c.id, J.c.attempts, J.c.lease_owner, J.c.attempt_limit,
                       J.c.cancel_requested, J.c.cancelled_by, J.c.parent_id)
                .where(self.q._ops.in_ids_param(J.c.id, "ids"), J.c.state == lit(S.RUNNING))
                .order_by(J.c.id)
            )
        for i in range(0, len(ids), CHUNK):
            for r in (await conn.execute(lock, {"ids": ids[i : i + CHUNK]})).all():
                o = by_key.get((r.id, r.attempts))
                if o is not None and r.lease_owner == o.owner:
                    held[r.id] = r
        applied = [o for o in outcomes if o.job_id in held and held[o.job_id].attempts == o.attempt]
        released = False
        done_rows = []
        now = db_now()
        cleared = {"lease_owner": None, "lease_expires": None}
        for o in applied:
            row = held[o.job_id]
            kind = o.kind
            # A cancel requested while the attempt ran wins over a retry or a release (else
            # the next claim would reset the flag and the cancel would be lost).
            if kind in ("failed", "released") and row.cancel_requested:
                kind = "cancelled"
            retry_in: float | None = None
            if kind == "done":
                done_rows.append({"i": o.job_id, "r": o.result})
            elif kind == "failed":
                # the attempt joins Job.errors in the same UPDATE (failure path only)
                errors = await history.with_failure(conn, J, o.job_id, o.attempt, o.error,
                                                    o.owner)
                if o.retryable and row.attempts < row.attempt_limit:
                    delay = backoff(row.attempts, self.q.retry_backoff, self.q.retry_backoff_max)
                    kind, retry_in = "retry", delay
                    await conn.execute(
                        update(J).where(J.c.id == o.job_id).values(
                            state=S.SCHEDULED, error=o.error, run_after=utcnow_plus(delay),
                            errors=errors, **cleared,
                        )
                    )
                else:
                    await conn.execute(
                        update(J).where(J.c.id == o.job_id).values(
                            state=S.FAILED, error=o.error, finished_at=now, live_key=None,
                            errors=errors, **cleared,
                        )
                    )
                    finished.append((o.job_id, S.FAILED))
            elif kind == "cancelled":
                err = o.error or _cancel_error(row.cancelled_by)
                await conn.execute(
                    update(J).where(J.c.id == o.job_id).values(
                        state=S.CANCELLED, error=err, finished_at=now, live_key=None, **cleared
                    )
                )
                finished.append((o.job_id, S.CANCELLED))
            elif kind == "released":
                # interrupted by shutdown: run again at once, and this attempt does not count
                await conn.execute(
                    update(J).where(J.c.id == o.job_id).values(
                        state=S.READY, attempt_limit=J.c.attempt_limit + 1, **cleared
                    )
                )
                released = True
            else:  # pragma: no cover - programming error
                raise ValueError(kind)
            effective.append(replace(o, kind=kind, retry_in=retry_in))
        if done_rows:
            done_vals = dict(state=S.DONE, error=None, finished_at=now, live_key=None, **cleared)
            # No result (None) is common: those rows share one set-based UPDATE.
            plain = sorted(r["i"] for r in done_rows if r["r"] is None)
            rich = [r for r in done_rows if r["r"] is not None]
            upd = stmts.get("finish.done")
            if upd is None:
                upd = update(J).where(self.q._ops.in_ids_param(J.c.id, "ids")).values(
                    result=None, **done_vals)
                # Not "RETURNING EXISTS (dependents)": with a skewed deps table (100k jobs
                # waiting on one) PostgreSQL's generic plan probes it by a sequential scan per
                # row; settle()'s one id-array look-up stays on the index.
                stmts["finish.done"] = upd
            for i in range(0, len(plain), CHUNK):
                await conn.execute(upd, {"ids": plain[i : i + CHUNK]})
            if rich:
                await conn.execute(
                    update(J).where(J.c.id == bindparam("i")).values(
                        result=bindparam("r", type_=J.c.result.type), **done_vals
                    ),
                    rich,
                )
            finished.extend((r["i"], S.DONE) for r in done_rows)
        if finished:
            hint.update({i: r.parent_id for i, r in held.items()})
            await self.settle(conn, finished, hint, leaves)
        if released:  # another worker may start it at once (not after its poll interval)
            await self.q._ops.notify(conn)
        return effective

    # -- consequences ---------------------------------------------------------------------
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
                select(J.c.parent_id).where(self.q._ops.in_ids(J.c.id, ids[i : i + CHUNK]),
                                            J.c.parent_id.is_not(None)).distinct()
            )
            out.update(r[0] for r in rows)
        return sorted(out)

    def _stmt(self, name: str, build: Callable[[], Any]) -> Any:
        """A statement built once per queue (construction and cache-key cost add up per round)."""
        stmt = self.q._stmts.get(name)
        if stmt is None:
            stmt = self.q._stmts[name] = build()
        return stmt

    def _unblock(self, pending: Any) -> dict[str, Any]:
        """SET clauses: ``pending`` becomes the new count, and a row left with nothing to wait
        for is released (a job: ready or scheduled, a container: active). Both expressions read
        the row as it was (standard SQL; the single-statement path runs only where that holds)."""
        J = self.J
        return {
            "pending": pending,
            "state": case(
                (pending > 0, lit(S.WAITING)),
                (J.c.kind == lit(S.CONTAINER), lit(S.ACTIVE)),
                (J.c.run_after <= db_now(), lit(S.READY)),
                else_=lit(S.SCHEDULED),
            ),
        }

    def _unblocked(self, wakes: bool = True) -> list[Any]:
        """RETURNING of the unblocking statements; where the dialect can (and ``wakes``), a
        row that became ready sends the wake-up from inside the statement (no extra round
        trip; PostgreSQL collapses the repeats of one transaction into one notification)."""
        J = self.J
        cols: list[Any] = [J.c.id, J.c.kind, J.c.state, J.c.parent_id]
        wake = self.q._ops.notify_expr() if wakes else None
        if wake is not None:
            cols.append(case((J.c.state == lit(S.READY), wake)).label("wake"))
        return cols

    def _drop_deps_stmt(self, ids: IdsMatch | None = None, wake: bool = True) -> Any:
        """One statement: count the edges from the finished ids (read now, after their rows
        were locked and updated), take that many off each waiting dependent, release those
        left with none; RETURNING every row it changed (all now locked by us). ``ids``:
        how the finished ids are matched (default: the bind parameter ``ids``); ``wake``:
        the RETURNING sends the wake-up where the dialect can."""
        J, D = self.J, self.D
        match = ids or (lambda col: self.q._ops.in_ids_param(col, "ids"))
        # MATERIALIZED: the edge look-up stays an index scan on depends_on_id; grouped in
        # line, PostgreSQL's generic plan may walk the whole deps key when it is skewed.
        e = (select(D.c.job_id).where(match(D.c.depends_on_id))
             .cte("e").prefix_with("MATERIALIZED"))
        c = select(e.c.job_id, func.count().label("n")).group_by(e.c.job_id).cte("c")
        return (update(J).where(self.q._ops.in_select(J.c.id, select(e.c.job_id)),
                                J.c.id == c.c.job_id, J.c.state == lit(S.WAITING))
                .values(**self._unblock(J.c.pending - c.c.n))
                .returning(*self._unblocked(wake)))

    def _drop_one_stmt(self, ids: IdsMatch) -> Any:
        """The waiting jobs among ``ids`` each stop waiting on one finished upstream (the
        split release's: each has one edge to it); RETURNING every row it changed."""
        J = self.J
        return (update(J).where(ids(J.c.id), J.c.state == lit(S.WAITING))
                .values(**self._unblock(J.c.pending - 1))
                .returning(*self._unblocked(False)))

    def _drop_kids_stmt(self, ids: IdsMatch | None = None, wake: bool = True) -> Any:
        """One statement: the waiting children of containers that just became active stop
        waiting on them; RETURNING every row it changed. ``ids``, ``wake``: as for
        _drop_deps_stmt (the containers' ids match ``parent_id``)."""
        J = self.J
        match = ids or (lambda col: self.q._ops.in_ids_param(col, "ids"))
        return (update(J).where(match(J.c.parent_id),
                                J.c.state == lit(S.WAITING), J.c.pending >= S.CREDIT)
                .values(**self._unblock(J.c.pending - S.CREDIT))
                .returning(*self._unblocked(wake)))

    async def _release_dependents(
        self, conn: AsyncConnection, done: Sequence[int]
    ) -> tuple[list[tuple[int, str, int | None]], set[int]]:
        """Unblock what waits on the ``done`` ids. Returns the containers that finished by
        it (with their parent) and the containers that hold a live child job this
        transaction has locked."""
        if self.q._ops.update_returning:
            # the routine where installed: the same statement, planned safely (see there)
            stmt = self.q._release_call
            if stmt is None:
                stmt = self._stmt("settle.drop_deps", self._drop_deps_stmt)
            rows: list[Any] = []
            for i in range(0, len(done), CHUNK):
                rows += (await conn.execute(stmt, {"ids": done[i : i + CHUNK]})).all()
            return await self._released(conn, rows)
        J, D = self.J, self.D
        counts: dict[int, int] = defaultdict(int)
        for i in range(0, len(done), CHUNK):
            # No GROUP BY: counted here. Grouped, PostgreSQL's generic plan walks the whole
            # deps primary key when the table is skewed (many jobs waiting on one upstream).
            edges = await conn.execute(
                select(D.c.job_id)
                .where(self.q._ops.in_ids(D.c.depends_on_id, done[i : i + CHUNK]))
            )
            for (jid,) in edges:
                counts[jid] += 1
        if not counts:
            return [], set()
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
        return await self._released(conn, await self._release_locked(conn, sorted(counts)))

    async def _release_locked(self, conn: AsyncConnection, ids: Sequence[int]) -> list[Any]:
        """Portable path: lock the waiting rows among ``ids`` and release those that wait on
        nothing. Returns (id, kind, state, parent_id) of the locked rows, as now."""
        J = self.J
        rows: list[Any] = []
        for i in range(0, len(ids), CHUNK):
            rows += (await conn.execute(self.q._ops.for_update(
                select(J.c.id, J.c.kind, J.c.pending, J.c.parent_id)
                .where(J.c.id.in_(ids[i : i + CHUNK]), J.c.state == lit(S.WAITING))
                .order_by(J.c.id)
            ))).all()
        free = [r.id for r in rows if r.pending <= 0]
        for i in range(0, len(free), CHUNK):
            await conn.execute(
                update(J).where(J.c.id.in_(free[i : i + CHUNK]), J.c.state == lit(S.WAITING))
                .values(**self._unblock(J.c.pending))
            )
        if any(r.pending <= 0 and r.kind != S.CONTAINER for r in rows):
            await self.q._ops.notify(conn)
        # READY stands for "ready or scheduled" here (the rows are only told apart as live).
        return [_Row(r.id, r.kind, S.WAITING if r.pending > 0 else
                     S.ACTIVE if r.kind == S.CONTAINER else S.READY, r.parent_id) for r in rows]

    async def _released(
        self, conn: AsyncConnection, rows: list[Any]
    ) -> tuple[list[tuple[int, str, int | None]], set[int]]:
        """Follow up rows just unblocked (``rows``: id, kind, state, parent_id, all locked by
        this transaction): containers that became active release their children in turn, and
        the empty ones finish. Returns (containers finished, containers with a live child job
        that we hold locked)."""
        J = self.J
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
            if self.q._ops.update_returning:
                stmt = self._stmt("settle.drop_kids", self._drop_kids_stmt)
                for i in range(0, len(boxes), CHUNK):
                    rows += (await conn.execute(stmt, {"ids": boxes[i : i + CHUNK]})).all()
            else:
                kids = await conn.execute(self.q._ops.for_update(
                    select(J.c.id).where(J.c.parent_id.in_(boxes), J.c.state == lit(S.WAITING),
                                         J.c.pending >= S.CREDIT).order_by(J.c.id)
                ))
                ids = sorted(r[0] for r in kids)
                for i in range(0, len(ids), CHUNK):
                    await conn.execute(
                        update(J).where(J.c.id.in_(ids[i : i + CHUNK]))
                        .values(pending=J.c.pending - S.CREDIT)
                    )
                rows = await self._release_locked(conn, ids)
            # the empty ones finish now; a box with a child job released above is not empty
            kid_jobs = {r.parent_id for r in rows if r.kind != S.CONTAINER}
            finished += await self._rollup(conn, [b for b in boxes if b not in kid_jobs])
        if any_ready and self.q._ops.notify_expr() is None:
            await self.q._ops.notify(conn)
        return finished, busy

    async def release(self, conn: AsyncConnection, ids: Sequence[int]) -> list[tuple[int, str]]:
        """Jobs among ``ids`` that wait on nothing any more become runnable (containers:
        active, and their children are released in turn). Returns containers finished by it."""
        finished, _ = await self._released(conn, await self._release_locked(conn, sorted(ids)))
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
                err = _cancel_error(c, cause_state[c])
                for i in range(0, len(jids), CHUNK):
                    part = jids[i : i + CHUNK]
                    await conn.execute(
                        update(J).where(J.c.id.in_(part), J.c.state == lit(S.RUNNING))
                        .values(cancel_requested=True, cancelled_by=c)
                    )
                    stmt = select(J.c.id).where(
                        J.c.id.in_(part), J.c.state.in_([S.WAITING, S.SCHEDULED, S.READY, S.ACTIVE])
                    )
                    victims = [r[0] for r in await conn.execute(self.q._ops.for_update(stmt))]
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
        lock = self._stmt("rollup.lock", lambda: self.q._ops.for_update(
            select(J.c.id, J.c.state, J.c.parent_id)
            .where(self.q._ops.in_ids_param(J.c.id, "ids")).order_by(J.c.id)))
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
        counter = self._stmt("rollup.census", census)
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

    # -- operator actions -----------------------------------------------------------------
    async def cancel(self, conn: AsyncConnection, job_id: int) -> str:
        """Cancel a job or container (and, by propagation, what waits on it)."""
        J = self.J
        row = (await conn.execute(
            self.q._ops.for_update(select(J.c.id, J.c.state, J.c.kind).where(J.c.id == job_id))
        )).first()
        if row is None:
            from .errors import JobNotFoundError

            raise JobNotFoundError(f"no job with id {job_id}")
        if row.state in S.TERMINAL:
            return str(row.state)
        err = {"type": "Cancelled", "message": "cancelled by request"}
        if row.state == S.RUNNING:
            await conn.execute(update(J).where(J.c.id == job_id).values(cancel_requested=True))
            return S.RUNNING
        await conn.execute(
            update(J).where(J.c.id == job_id).values(
                state=S.CANCELLED, error=err, finished_at=db_now(), live_key=None
            )
        )
        await self.settle(conn, [(job_id, S.CANCELLED)])
        return S.CANCELLED

    async def _unrecord(self, conn: AsyncConnection, ids: Sequence[int]) -> None:
        """Take revived ``ids`` out of the recorded rest of split releases (see SPLIT): their
        ``pending`` is counted afresh by retry(), where a done upstream no longer counts, so
        the release of that rest must not take the edge off again. The parts are locked
        first (a release of one in flight is waited for; it skips a job not waiting)."""
        q = self.q
        R = q._t.releases
        revived = set(ids)
        parts = await conn.execute(q._ops.for_update(select(R.c.id, R.c.ids).order_by(R.c.id)))
        for part in parts.all():
            if revived.isdisjoint(part.ids):
                continue
            keep = [i for i in part.ids if i not in revived]
            await conn.execute(update(R).where(R.c.id == part.id).values(ids=keep) if keep
                               else delete(R).where(R.c.id == part.id))

    async def retry(self, conn: AsyncConnection, job_id: int) -> list[int]:
        """Make a failed/cancelled job runnable again, with the jobs its end cancelled and the
        containers it made fail. Returns every id that was revived."""
        from .errors import InvalidStateError, JobNotFoundError

        J, D = self.J, self.D
        row = (await conn.execute(
            self.q._ops.for_update(select(J.c.id, J.c.state, J.c.parent_id).where(J.c.id == job_id))
        )).first()
        if row is None:
            raise JobNotFoundError(f"no job with id {job_id}")
        if row.state not in (S.FAILED, S.CANCELLED):
            raise InvalidStateError(
                f"job {job_id} is {row.state}; only failed or cancelled jobs can be retried"
            )
        revive: set[int] = {job_id}
        # To a fixed point: jobs cancelled because of a revived job; the failed/cancelled
        # containers of revived jobs (a roll-up ended them; they reopen with their child); and
        # the failed/cancelled children of a container retried on purpose (retrying a
        # container retries what made it fail; a reopened one does not revive its siblings).
        frontier = {job_id}
        on_purpose = {job_id}
        while frontier:
            part = sorted(frontier)
            rows = await conn.execute(
                select(J.c.id).where(J.c.cancelled_by.in_(part), J.c.state == lit(S.CANCELLED))
            )
            nxt = {r[0] for r in rows}
            par = J.alias("par")
            rows = await conn.execute(
                select(par.c.id).join(J, J.c.parent_id == par.c.id)
                .where(J.c.id.in_(part), par.c.state.in_([S.FAILED, S.CANCELLED]))
            )
            nxt |= {r[0] for r in rows}
            down = sorted(frontier & on_purpose)
            if down:
                rows = await conn.execute(
                    select(J.c.id).where(J.c.parent_id.in_(down),
                                         J.c.state.in_([S.FAILED, S.CANCELLED]))
                )
                kids = {r[0] for r in rows}
                on_purpose |= kids
                nxt |= kids
            frontier = nxt - revive
            revive |= frontier
        ids = sorted(revive)
        await self._unrecord(conn, ids)
        # recompute pending from scratch for each revived job
        for i in range(0, len(ids), CHUNK):
            part = ids[i : i + CHUNK]
            await conn.execute(
                update(J).where(J.c.id.in_(part)).values(
                    state=S.WAITING, error=None, finished_at=None, cancelled_by=None,
                    cancel_requested=False, live_key=J.c.key, pending=0,
                    attempt_limit=case((J.c.kind == S.JOB, J.c.attempts + J.c.max_attempts),
                                       else_=J.c.attempt_limit),
                    run_after=db_now(),
                )
            )
        up = J.alias("up")
        pending: dict[int, int] = defaultdict(int)
        for i in range(0, len(ids), CHUNK):
            part = ids[i : i + CHUNK]
            rows = await conn.execute(
                select(D.c.job_id, func.count()).join(up, up.c.id == D.c.depends_on_id)
                .where(D.c.job_id.in_(part), up.c.state != lit(S.DONE)).group_by(D.c.job_id)
            )
            for jid, n in rows:
                pending[jid] += n
            par = J.alias("par")
            rows = await conn.execute(
                select(J.c.id).join(par, par.c.id == J.c.parent_id)
                .where(J.c.id.in_(part), par.c.state != lit(S.ACTIVE))
            )
            for (jid,) in rows:
                pending[jid] += S.CREDIT
        for jid, n in pending.items():
            await conn.execute(update(J).where(J.c.id == jid).values(pending=n))
        # release parents first so their children see an active container
        await self.release(conn, ids)
        # A revived job with another upstream still failed/cancelled can never run: cancel it
        # again (its dependents follow) instead of leaving it waiting for ever.
        dead = J.alias("dead")
        stuck: dict[int, tuple[int, str]] = {}
        for i in range(0, len(ids), CHUNK):
            rows = await conn.execute(
                select(D.c.job_id, dead.c.id, dead.c.state)
                .join(dead, dead.c.id == D.c.depends_on_id)
                .where(D.c.job_id.in_(ids[i : i + CHUNK]),
                       dead.c.state.in_([S.FAILED, S.CANCELLED]))
                .order_by(D.c.job_id, dead.c.id)
            )
            for jid, cause, cause_state in rows:
                stuck.setdefault(jid, (cause, cause_state))
        for jid, (cause, cause_state) in sorted(stuck.items()):
            await conn.execute(
                update(J).where(J.c.id == jid, J.c.state.in_(S.LIVE)).values(
                    state=S.CANCELLED, error=_cancel_error(cause, cause_state),
                    cancelled_by=cause, finished_at=db_now(), live_key=None,
                )
            )
        if stuck:
            await self.settle(conn, [(jid, S.CANCELLED) for jid in sorted(stuck)])
        return ids


def _by_attempt(
    outcomes: Iterable[Outcome],
) -> list[tuple[tuple[int, str], list[Outcome]]]:
    """Successes grouped by (attempt, owner), each group in job id order (one fenced
    statement per group; rows locked in id order)."""
    by: dict[tuple[int, str], list[Outcome]] = defaultdict(list)
    for o in outcomes:
        assert o.kind == "done"
        by[(o.attempt, o.owner)].append(o)
    return [(k, sorted(g, key=lambda o: o.job_id)) for k, g in sorted(by.items())]


def _cancel_error(cause: int | None, cause_state: str | None = None) -> dict[str, Any]:
    if cause is None:
        return {"type": "Cancelled", "message": "cancelled by request"}
    verb = "cancelled" if cause_state == S.CANCELLED else "failed"
    return {"type": "UpstreamFailed", "message": f"upstream {cause} {verb}"}


class _Row(NamedTuple):
    id: int
    kind: str
    state: str
    parent_id: int | None


def and_all(*c: Any) -> Any:
    return and_(*c)

"""Fenced finalize, container roll-up, release of dependents and failure propagation.

Every function here runs inside the caller's write transaction, so a finalize and all of its
consequences commit together or not at all.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, bindparam, case, false, func, literal_column, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .policy import backoff
from .timeutil import db_now, utcnow_plus

if TYPE_CHECKING:
    from .queue import JobQueue

log = logging.getLogger("aiojobqueue.completer")
CHUNK = 1000


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
        J = self.J
        stmt = self.q._stmts.get("finish.fast")
        if stmt is None:
            stmt = self.q._stmts["finish.fast"] = (
                update(J)
                .where(self.q._ops.in_ids_param(J.c.id, "ids"), J.c.state == lit(S.RUNNING),
                       J.c.attempts == bindparam("a"), J.c.lease_owner == bindparam("o"),
                       J.c.has_dependents == false(), J.c.parent_id.is_(None))
                .values(state=S.DONE, result=None, error=None, finished_at=db_now(),
                        live_key=None, lease_owner=None, lease_expires=None)
                .returning(J.c.id)
            )
        by: dict[tuple[int, str], list[int]] = defaultdict(list)
        for o in outcomes:
            assert o.kind == "done" and o.result is None
            by[(o.attempt, o.owner)].append(o.job_id)
        out: set[tuple[int, int]] = set()
        for (a, owner), ids in sorted(by.items()):
            ids.sort()
            for i in range(0, len(ids), CHUNK):
                rows = await conn.execute(stmt, {"ids": ids[i : i + CHUNK], "a": a, "o": owner})
                out.update((r[0], a) for r in rows)
        return out

    async def finish_detailed(
        self, conn: AsyncConnection, outcomes: Sequence[Outcome]
    ) -> list[Outcome]:
        """``finish()``, returning what actually happened to each applied outcome: ``kind``
        becomes ``retry`` (with ``retry_in``) or ``failed`` for a failure, ``cancelled`` for
        a failure that met a cancel request (for hooks and logs)."""
        J = self.J
        if not outcomes:
            return []
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
        finished: list[tuple[int, str]] = []
        released = False
        done_rows = []
        now = db_now()
        cleared = {"lease_owner": None, "lease_expires": None}
        effective: list[Outcome] = []  # what actually happened, for hooks and logs
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
                if o.retryable and row.attempts < row.attempt_limit:
                    delay = backoff(row.attempts, self.q.retry_backoff, self.q.retry_backoff_max)
                    kind, retry_in = "retry", delay
                    await conn.execute(
                        update(J).where(J.c.id == o.job_id).values(
                            state=S.SCHEDULED, error=o.error, run_after=utcnow_plus(delay),
                            **cleared,
                        )
                    )
                else:
                    await conn.execute(
                        update(J).where(J.c.id == o.job_id).values(
                            state=S.FAILED, error=o.error, finished_at=now, live_key=None,
                            **cleared,
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
        leaves: set[int] = set()
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
            hint = {i: r.parent_id for i, r in held.items()}
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
            newly: list[tuple[int, str]] = []
            if done:
                newly += await self._release_dependents(conn, done)
            if bad:
                cancelled = await self._cancel_downstream(conn, bad)
                work = work + [(i, S.CANCELLED) for i in cancelled]
            known = parents or {}
            ups = await self._parents_of(conn, [i for i, _ in work if i not in known])
            ups = sorted({*ups, *(p for i, _ in work if (p := known.get(i)) is not None)})
            newly += await self.rollup(conn, ups)
            work = newly
            parents = leaves = None

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

    async def _release_dependents(
        self, conn: AsyncConnection, done: Sequence[int]
    ) -> list[tuple[int, str]]:
        J, D = self.J, self.D
        counts: dict[int, int] = defaultdict(int)
        for i in range(0, len(done), CHUNK):
            # No GROUP BY: counted here. Grouped, PostgreSQL's generic plan walks the whole
            # deps primary key when the table is skewed (many jobs waiting on one upstream).
            rows = await conn.execute(
                select(D.c.job_id)
                .where(self.q._ops.in_ids(D.c.depends_on_id, done[i : i + CHUNK]))
            )
            for (jid,) in rows:
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
        return await self.release(conn, sorted(counts))

    async def release(self, conn: AsyncConnection, ids: Sequence[int]) -> list[tuple[int, str]]:
        """Jobs among ``ids`` that wait on nothing any more become runnable (containers:
        active, and their children are released in turn). Returns containers finished by it."""
        J = self.J
        finished: list[tuple[int, str]] = []
        now = db_now()
        todo = list(ids)
        any_ready = False
        while todo:
            leaves: list[int] = []
            boxes: list[int] = []
            for i in range(0, len(todo), CHUNK):
                rows = await conn.execute(
                    select(J.c.id, J.c.kind).where(
                        J.c.id.in_(todo[i : i + CHUNK]), J.c.state == lit(S.WAITING),
                        J.c.pending <= 0,
                    )
                )
                for r in rows:
                    (boxes if r.kind == S.CONTAINER else leaves).append(r.id)
            for i in range(0, len(leaves), CHUNK):
                any_ready = True
                await conn.execute(
                    update(J).where(J.c.id.in_(leaves[i : i + CHUNK]), J.c.state == lit(S.WAITING))
                    .values(state=case((J.c.run_after <= now, S.READY), else_=S.SCHEDULED))
                )
            todo = []
            if boxes:
                boxes.sort()
                await conn.execute(
                    update(J).where(J.c.id.in_(boxes), J.c.state == lit(S.WAITING))
                    .values(state=S.ACTIVE)
                )
                await conn.execute(
                    update(J).where(J.c.parent_id.in_(boxes), J.c.state == lit(S.WAITING))
                    .values(pending=J.c.pending - 1)
                )
                rows = await conn.execute(
                    select(J.c.id).where(J.c.parent_id.in_(boxes), J.c.state == lit(S.WAITING),
                                         J.c.pending <= 0)
                )
                todo = [r[0] for r in rows]
                finished += await self.rollup(conn, boxes)  # empty ones finish now
        if any_ready:
            await self.q._ops.notify(conn)
        return finished

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
        """Finish each container whose children are all terminal. The container row is
        locked first, so two last children finishing at once cannot both miss the roll-up."""
        J = self.J
        out: list[tuple[int, str]] = []
        for cid in sorted(containers):
            row = (await conn.execute(
                self.q._ops.for_update(select(J.c.state).where(J.c.id == cid))
            )).first()
            if row is None or row.state in S.TERMINAL:
                continue
            # One index probe while children are still live (the common case), so a container
            # of n children costs O(n) over its life, not O(n^2); count only at the end.
            live = (await conn.execute(
                select(J.c.id).where(J.c.parent_id == cid, J.c.state.in_(S.LIVE)).limit(1)
            )).first()
            if live is not None:
                continue
            counts: dict[str, int] = dict((await conn.execute(
                select(J.c.state, func.count()).where(J.c.parent_id == cid).group_by(J.c.state)
            )).all())
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
                update(J).where(J.c.id == cid, J.c.state.in_(S.LIVE)).values(
                    state=state, error=err, finished_at=db_now(), live_key=None
                )
            )
            out.append((cid, state))
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
                pending[jid] += 1
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


def _cancel_error(cause: int | None, cause_state: str | None = None) -> dict[str, Any]:
    if cause is None:
        return {"type": "Cancelled", "message": "cancelled by request"}
    verb = "cancelled" if cause_state == S.CANCELLED else "failed"
    return {"type": "UpstreamFailed", "message": f"upstream {cause} {verb}"}


def and_all(*c: Any) -> Any:
    return and_(*c)

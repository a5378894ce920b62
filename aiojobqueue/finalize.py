"""Fenced finalize: an attempt's outcome takes effect only if its worker still holds that
attempt's lease (state running, or leased for a job held ahead, same attempt number, same
lease owner); otherwise it changes nothing. Every statement here runs in the caller's
transaction (or is atomic by itself, for the autocommit paths), and hands what became
terminal to ``settle.Settler``. A held job started in an ended attempt's slot is made
``running`` first, in the same transaction (held.py).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, case, false, null, update
from sqlalchemy.ext.asyncio import AsyncConnection

from . import finalize_rows, held, history, snooze
from . import schema as S
from .attempts import round_attempt
from .database import Database
from .policy import backoff
from .release import IdsMatch
from .settings import Settings
from .settle import Settler, cancel_error
from .sql import chunks, lit
from .timeutil import db_now

if TYPE_CHECKING:
    from .claimed import LeaseAsk


@dataclass(frozen=True)
class Outcome:
    """How one attempt ended. ``kind``: done | failed | cancelled | released | snoozed
    (``retry_in``: the seconds the handler's ``Snooze`` asked for).

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
    #: A failure's new ``trace`` value (the first traced attempt's span added, for the
    #: retry's link: aiojobqueue.tracing); None leaves the column as it is.
    trace: dict[str, Any] | None = None
    #: (job id, attempt) of a held job (state ``leased``) its worker started in this
    #: attempt's slot when it ended: the transaction that writes this outcome makes that
    #: row ``running`` first (Finalizer.swap_in), so the slot stays counted throughout.
    swap: tuple[int, int] | None = None


def plain_stmt(db: Database, alone: bool, ids: IdsMatch | None = None, attempt: Any = None,
                owner: Any = None, result: Any = None, returning: bool = True) -> Any:
    """The fenced UPDATE of Finalizer.finish_plain; by default its ids, attempt and owner are bind
    parameters ``ids``, ``a``, ``o`` and it stores no result (other expressions: the
    server-side routine's). ``returning=False``: counted instead (finish_counted)."""
    J = db.t.jobs
    match = ids or (lambda col: db.ops.in_ids_param(col, "ids"))
    cond = [match(J.c.id), J.c.state == lit(S.RUNNING),
            J.c.attempts == (bindparam("a") if attempt is None else attempt),
            J.c.lease_owner == (bindparam("o") if owner is None else owner)]
    if alone:
        cond += [J.c.has_dependents == false(), J.c.parent_id.is_(None)]
    stmt = (
        update(J).where(*cond)
        .values(state=S.DONE, result=result, error=None, finished_at=db_now(),
                live_key=None, lease_owner=None, lease_expires=None)
    )
    return stmt.returning(J.c.id, J.c.parent_id, J.c.has_dependents) if returning else stmt


def counted_stmt(db: Database, rich: int) -> Any:
    """Finalizer.finish_counted's UPDATE: plain_stmt for jobs with no parent and no
    dependents, counted; ``rich`` of them store a result (bind parameters ``i<k>``,
    ``r<k>``: id and result), the others none (NULL, as the general path stores)."""
    J = db.t.jobs
    result: Any = None
    if rich:
        result = case(*[(J.c.id == bindparam(f"i{k}"),
                         bindparam(f"r{k}", type_=J.c.result.type)) for k in range(rich)],
                      else_=null())
    return plain_stmt(db, True, result=result, returning=False)


class Recount(Exception):
    """finish_counted could not finish every outcome it was given: the transaction must
    be rolled back whole and the batch written by finish_detailed."""


class Finalizer:
    """Writes outcomes: the general fenced finalize (finish_detailed) and its one-statement
    and one-call shortcuts."""

    def __init__(self, settings: Settings, db: Database, settler: Settler,
                 settle_call: Any = None, on_split: Callable[[], None] | None = None) -> None:
        self.settings = settings
        self.db = db
        self.settler = settler
        #: the call of the one-call finalize routine, where installed (PostgreSQL)
        self.settle_call = settle_call
        #: called when that call split the release of a wide fan-out (see fanout.py)
        self.on_split = on_split
        self.J = db.t.jobs

    async def swap_in(self, conn: AsyncConnection, started: Sequence[tuple[int, int]],
                      ending: Sequence[Outcome] = ()) -> None:
        """Make the held jobs ``started`` (id, attempt) ``running``, in the transaction
        that writes the outcomes of the attempts whose slots they took (``ending``) and
        before them (held.swap_in)."""
        await held.swap_in(self.db, self.settings, conn, started, ending)

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
        return {(r.id, a) for r, a in await self.finish_plain(conn, outcomes, alone=True)}

    async def finish_plain(
        self, conn: AsyncConnection, outcomes: Sequence[Outcome], alone: bool
    ) -> list[tuple[Any, int]]:
        """Successes without a result, fenced (state, attempt, lease owner) and applied by one
        UPDATE ... RETURNING per (attempt, owner): no lock-and-read first. ``alone``: only
        jobs with no parent and no dependents (nothing else to do). Returns (row: id,
        parent_id, has_dependents as updated, attempt); the row values are those of the
        version updated, so an edge committed while the UPDATE waited for the row shows."""
        stmt = self.db.stmt("finish.alone" if alone else "finish.plain",
                            lambda: plain_stmt(self.db, alone))
        out: list[tuple[Any, int]] = []
        for (a, owner), group in _by_attempt(outcomes):
            assert all(o.result is None for o in group)
            ids = [o.job_id for o in group]
            for part in chunks(ids):
                rows = await conn.execute(stmt, {"ids": part, "a": a, "o": owner})
                out += [(r, a) for r in rows]
        return out

    async def finish_counted(self, conn: AsyncConnection, outcomes: Sequence[Outcome]) -> None:
        """Where the database has no UPDATE ... RETURNING (MySQL, MariaDB): successes of jobs
        leased with no parent and no dependents, by one fenced UPDATE per (attempt, owner)
        that also requires both still (finish_fast's statement, counted instead of
        returning, the results set by a CASE on the id): nothing else changes when such a
        job ends, so where every row matched this is the whole finalize (no lock-and-read,
        no look-up of dependents, no UPDATE per result: one statement instead of three or
        more). Where any did not (an edge added since, an attempt fenced out), a count
        cannot say which rows changed: raises Recount, and the caller rolls the transaction
        back and writes the batch by finish_detailed. (The UPDATE that waited for a row
        lock matches the row as committed, as finish_fast's does.)"""
        db = self.db
        for (a, owner), group in _by_attempt(outcomes):
            for part in chunks(group):
                params: dict[str, Any] = {"ids": [o.job_id for o in part], "a": a, "o": owner}
                rich = [o for o in part if o.result is not None]
                for k, o in enumerate(rich):
                    params[f"i{k}"], params[f"r{k}"] = o.job_id, o.result
                # results by one CASE on the id (the general path sends an UPDATE per job)
                n = len(rich)
                stmt = db.stmt(f"finish.counted.{n}", partial(counted_stmt, db, n))
                res = await conn.execute(stmt, params)
                if res.rowcount != len(part):
                    raise Recount

    async def finish_in_one_call(
        self, conn: AsyncConnection, outcomes: Sequence[Outcome], ask: LeaseAsk | None = None,
    ) -> set[tuple[int, int]]:
        """Finish ``done`` outcomes by one call of the server-side routine (PostgreSQL, see
        dialects/postgresql) per attempt number: the fenced UPDATE (storing the
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
        s = self.settings
        stmt = self.settle_call
        assert stmt is not None
        calls: list[tuple[int, dict[str, Any]]] = []
        for (a, owner), group in _by_attempt(outcomes):
            for part in chunks(group):
                results = [o.result for o in part]
                calls.append((a, {"ids": [o.job_id for o in part], "a": a, "o": owner,
                                  "r": json.dumps(results) if any(r is not None for r in results)
                                  else None, "g": None, "types": None, "n": 0, "lo": None,
                                  "ttl": None}))
        if ask is not None and calls:
            # n < 0: a cap's hand-over (no more leased than the call finished)
            calls[-1][1].update(g=ask.group, types=ask.types, n=-ask.n if ask.hand else ask.n,
                                lo=s.worker_id,
                                ttl=s.lease_ttl)
        took: set[tuple[int, int]] = set()
        for a, params in calls:
            done, leased, rest = (await conn.execute(stmt, params)).one()
            took.update((j, a) for j in done or ())
            if ask is not None and params["n"] and done is not None:
                ask.rows = leased
            if rest is not None and self.on_split is not None:
                self.on_split()
        return took

    async def finish_detailed(
        self, conn: AsyncConnection, outcomes: Sequence[Outcome]
    ) -> list[Outcome]:
        """``finish()``, returning what actually happened to each applied outcome: ``kind``
        becomes ``retry`` (with ``retry_in``) or ``failed`` for a failure, ``cancelled`` for
        a failure that met a cancel request (for hooks and logs)."""
        if not outcomes:
            return []
        finished: list[tuple[int, str]] = []
        hint: dict[int, int | None] = {}
        leaves: set[int] = set()
        effective: list[Outcome] = []  # what actually happened, for hooks and logs
        # Plain successes need none of the lock-and-read below (no retry, cancel or result
        # to decide): one UPDATE ... RETURNING each where the dialect has it; what settle()
        # needs comes back with it.
        plain = [o for o in outcomes if o.kind == "done" and o.result is None]
        path = self.settler.path
        got = await path.finish_plain(conn, plain, self.finish_plain) if plain else None
        if got is not None:
            took = set()
            for r, a in got:
                took.add((r.id, a))
                finished.append((r.id, S.DONE))
                hint[r.id] = r.parent_id
                if not r.has_dependents:
                    leaves.add(r.id)
            effective += [o for o in plain if (o.job_id, o.attempt) in took]
            outcomes = [o for o in outcomes if not (o.kind == "done" and o.result is None)]
        held = await self._lock_held(conn, outcomes)
        leaves.update(i for i, r in held.items() if not r.has_dependents)
        applied = [o for o in outcomes if o.job_id in held and held[o.job_id].attempts == o.attempt]
        released = False
        done_rows = []
        now = db_now()
        for o in applied:
            ended = await self._end_attempt(conn, o, held[o.job_id], now)
            if ended.kind == "done":  # written below, with the other successes
                done_rows.append({"i": o.job_id, "r": o.result})
            elif ended.kind in (S.FAILED, S.CANCELLED):
                finished.append((o.job_id, ended.kind))
            released = released or ended.kind == "released"
            effective.append(ended)
        if done_rows:
            await finalize_rows.end_done(self.db, conn, done_rows, now)
            finished.extend((r["i"], S.DONE) for r in done_rows)
        if finished:
            hint.update({i: r.parent_id for i, r in held.items()})
            await self.settler.settle(conn, finished, hint, leaves)
        if released:  # another worker may start it at once (not after its poll interval)
            await self.db.ops.notify(conn)
        return effective

    async def _lock_held(
        self, conn: AsyncConnection, outcomes: Sequence[Outcome]
    ) -> dict[int, Any]:
        """The fence: lock the rows of the jobs of ``outcomes`` and return (by job id) those
        whose worker still holds an outcome's attempt (same attempt number, same owner)."""
        by_key = {(o.job_id, o.attempt): o for o in outcomes}
        ids = sorted({o.job_id for o in outcomes})
        held: dict[int, Any] = {}
        for r in await finalize_rows.lock_leased(self.db, conn, ids):
            o = by_key.get((r.id, r.attempts))
            if o is not None and r.lease_owner == o.owner:
                held[r.id] = r
        return held

    async def _end_attempt(
        self, conn: AsyncConnection, o: Outcome, row: Any, now: Any
    ) -> Outcome:
        """Write what ``o`` comes to, given its job's locked ``row`` (a success: nothing
        yet, the caller writes them together); returns ``o`` as it took effect."""
        kind = o.kind
        # A cancel requested while the attempt ran wins over a retry or a release (else
        # the next claim would reset the flag and the cancel would be lost).
        if kind in ("failed", "released", "snoozed") and row.cancel_requested:
            kind = "cancelled"
        retry_in: float | None = None
        if kind == "failed":
            kind, retry_in = await self._end_failure(conn, o, row, now)
        elif kind == "cancelled":
            err = o.error or cancel_error(row.cancelled_by)
            await finalize_rows.end_cancelled(self.db, conn, o.job_id, err, now)
        elif kind == "released":
            # interrupted by shutdown: run again at once, and this attempt does not count
            await finalize_rows.end_released(self.db, conn, o.job_id)
        elif kind == "snoozed":  # back to scheduled, no attempt used (snooze.py)
            await snooze.write(self.db, conn, o.job_id, o.retry_in or 0.0)
            retry_in = o.retry_in
        elif kind != "done":  # pragma: no cover - programming error
            raise ValueError(kind)
        return replace(o, kind=kind, retry_in=retry_in)

    async def _end_failure(
        self, conn: AsyncConnection, o: Outcome, row: Any, now: Any
    ) -> tuple[str, float | None]:
        """Write the failure ``o`` (its job's ``row`` locked): a retry after the backoff
        where attempts are left and the error is retryable, else failed for good. Returns
        (``retry``, the delay) or (``failed``, None)."""
        # the attempt joins Job.errors in the same UPDATE (the failure path only: a
        # success writes no history); the row is locked by the caller
        errors = await history.with_failure(conn, self.J, o.job_id, o.attempt, o.error,
                                            o.owner)
        # a traced failure keeps its span for the retry's link (aiojobqueue.tracing)
        errors_and = {"errors": errors} if o.trace is None else {
            "errors": errors, "trace": o.trace}
        if o.retryable and row.attempts < row.attempt_limit:
            # grows within the round in force: a manual retry starts again
            delay = backoff(
                round_attempt(row.attempts, row.attempt_limit, row.max_attempts),
                self.settings.retry_backoff, self.settings.retry_backoff_max)
            await finalize_rows.end_retry(self.db, conn, o.job_id, o.error, delay, errors_and)
            return "retry", delay
        await finalize_rows.end_failed(self.db, conn, o.job_id, o.error, now, errors_and)
        return "failed", None


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

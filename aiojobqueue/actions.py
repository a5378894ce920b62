"""Operator actions: cancel a job (and what waits on it), retry a failed or cancelled one
(and what its end cancelled). Each runs inside the caller's write transaction."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from sqlalchemy import case, delete, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from . import conditions
from . import schema as S
from .database import Database
from .errors import InvalidStateError, JobNotFoundError
from .settle import Settler, cancel_error
from .sql import chunks, lit
from .timeutil import db_now


class Actions:
    """cancel() and retry() on the caller's transaction."""

    def __init__(self, db: Database, settler: Settler) -> None:
        self.db = db
        self.settler = settler
        self.J = db.t.jobs
        self.D = db.t.deps

    async def cancel(self, conn: AsyncConnection, job_id: int) -> str:
        """Cancel a job or container (and, by propagation, what waits on it)."""
        J = self.J
        row = (await conn.execute(
            self.db.ops.for_update(select(J.c.id, J.c.state, J.c.kind).where(J.c.id == job_id))
        )).first()
        if row is None:
            raise JobNotFoundError(f"no job with id {job_id}")
        if row.state in S.TERMINAL:
            return str(row.state)
        err = {"type": "Cancelled", "message": "cancelled by request"}
        if row.state in S.LEASED_STATES:  # its worker stops it (a held one: gives it back)
            await conn.execute(update(J).where(J.c.id == job_id).values(cancel_requested=True))
            return str(row.state)
        await conn.execute(
            update(J).where(J.c.id == job_id).values(
                state=S.CANCELLED, error=err, finished_at=db_now(), live_key=None
            )
        )
        await self.settler.settle(conn, [(job_id, S.CANCELLED)])
        return S.CANCELLED

    async def _unrecord(self, conn: AsyncConnection, ids: Sequence[int]) -> None:
        """Take revived ``ids`` out of the recorded rest of split releases (see fanout.py): their
        ``pending`` is counted afresh by retry(), where a done upstream no longer counts, so
        the release of that rest must not take the edge off again. The parts are locked
        first (a release of one in flight is waited for; it skips a job not waiting)."""
        R = self.db.t.releases
        revived = set(ids)
        parts = await conn.execute(self.db.ops.for_update(select(R.c.id, R.c.ids).order_by(R.c.id)))
        for part in parts.all():
            if revived.isdisjoint(part.ids):
                continue
            keep = [i for i in part.ids if i not in revived]
            await conn.execute(update(R).where(R.c.id == part.id).values(ids=keep) if keep
                               else delete(R).where(R.c.id == part.id))

    async def retry(self, conn: AsyncConnection, job_id: int) -> list[int]:
        """Make a failed/cancelled job runnable again, with the jobs its end cancelled and the
        containers it made fail. Returns every id that was revived."""
        J = self.J
        row = (await conn.execute(
            self.db.ops.for_update(select(J.c.id, J.c.state, J.c.parent_id).where(J.c.id == job_id))
        )).first()
        if row is None:
            raise JobNotFoundError(f"no job with id {job_id}")
        if row.state not in (S.FAILED, S.CANCELLED):
            raise InvalidStateError(
                f"job {job_id} is {row.state}; only failed or cancelled jobs can be retried"
            )
        ids = await self._to_revive(conn, job_id)
        await self._unrecord(conn, ids)
        await self._reopen(conn, ids)
        cond = await self._recount(conn, ids)
        # release parents first so their children see an active container
        unmet = [(i, st) for i, st in await self.settler.release(conn, ids) if st == S.CANCELLED]
        if unmet:  # when="failed" jobs whose dependencies are all done now (conditions.py)
            await self.settler.settle(conn, unmet)
        await self._cancel_stuck(conn, ids, cond)
        return ids

    async def _to_revive(self, conn: AsyncConnection, job_id: int) -> list[int]:
        """The ids a retry of ``job_id`` revives (``job_id`` among them), in order."""
        J = self.J
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
        return sorted(revive)

    async def _reopen(self, conn: AsyncConnection, ids: list[int]) -> None:
        """Set the revived jobs waiting, their end undone and their attempts renewed (pending
        0 until _recount)."""
        J = self.J
        # recompute pending from scratch for each revived job
        for part in chunks(ids):
            await conn.execute(
                update(J).where(J.c.id.in_(part)).values(
                    state=S.WAITING, error=None, finished_at=None, cancelled_by=None,
                    cancel_requested=False, live_key=J.c.key, pending=0,
                    attempt_limit=case((J.c.kind.in_([S.JOB, *conditions.CONDITIONED]),
                                        J.c.attempts + J.c.max_attempts),
                                       else_=J.c.attempt_limit),
                    run_after=db_now(),
                )
            )

    async def _recount(self, conn: AsyncConnection, ids: list[int]) -> dict[int, int]:
        """Count each revived job's pending afresh: upstreams not done (a run condition its
        own way) and the credit for a container not active. Returns the pending counts of
        the jobs with a run condition."""
        J, D = self.J, self.D
        up = J.alias("up")
        pending: dict[int, int] = defaultdict(int)
        cond: dict[int, int] = {}  # jobs with a run condition count their own way
        for part in chunks(ids):
            cond.update(await conditions.count(self.db, conn, part))
            rows = await conn.execute(
                select(D.c.job_id, func.count()).join(up, up.c.id == D.c.depends_on_id)
                .where(D.c.job_id.in_(part), up.c.state != lit(S.DONE)).group_by(D.c.job_id)
            )
            for jid, n in rows:
                if jid not in cond:
                    pending[jid] += n
            for jid, n in cond.items():
                if jid in part:
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
        return cond

    async def _cancel_stuck(
        self, conn: AsyncConnection, ids: list[int], cond: dict[int, int]
    ) -> None:
        """Cancel again the revived jobs (``cond``: those with a run condition, exempt) that
        another failed or cancelled upstream keeps from ever running."""
        J, D = self.J, self.D
        # A revived job with another upstream still failed/cancelled can never run: cancel it
        # again (its dependents follow) instead of leaving it waiting for ever.
        dead = J.alias("dead")
        stuck: dict[int, tuple[int, str]] = {}
        for part in chunks(ids):
            rows = await conn.execute(
                select(D.c.job_id, dead.c.id, dead.c.state)
                .join(dead, dead.c.id == D.c.depends_on_id)
                .where(D.c.job_id.in_(part),
                       dead.c.state.in_([S.FAILED, S.CANCELLED]))
                .order_by(D.c.job_id, dead.c.id)
            )
            for jid, cause, cause_state in rows:
                if jid not in cond:  # a failed upstream is what a condition waits for
                    stuck.setdefault(jid, (cause, cause_state))
        for jid, (cause, cause_state) in sorted(stuck.items()):
            await conn.execute(
                update(J).where(J.c.id == jid, J.c.state.in_(S.LIVE)).values(
                    state=S.CANCELLED, error=cancel_error(cause, cause_state),
                    cancelled_by=cause, finished_at=db_now(), live_key=None,
                )
            )
        if stuck:
            await self.settler.settle(conn, [(jid, S.CANCELLED) for jid in sorted(stuck)])

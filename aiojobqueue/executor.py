"""One attempt of one job: the handler call under its timeout, with every outcome captured."""

from __future__ import annotations

import asyncio
import logging
import traceback
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy import update

from . import fanin, progress, threads, tracing
from . import schema as S
from .batch import Batch, check_json
from .claimed import Claimed
from .database import Database
from .errors import LeaseLostError, NotJSONError
from .finalize import Outcome
from .handlers import Handler, HandlerSpec
from .snooze import Snooze
from .sql import lit

if TYPE_CHECKING:
    from .core import Core
    from .queue import JobQueue

log = logging.getLogger("aiojobqueue.worker")

__all__ = ["HandlerSpec", "JobContext", "LeaseLostError", "run_attempt"]


class JobContext:
    """What a running handler gets as its first argument."""

    def __init__(self, queue: JobQueue, db: Database, worker_id: str, claimed: Claimed) -> None:
        self._q = queue
        self._db = db
        self._me = worker_id
        self._c = claimed
        #: The state saved by the last ``checkpoint()`` of an earlier attempt, else None.
        self.checkpointed: Any = claimed.checkpoint
        self._progress: progress.Reporter | None = None

    @property
    def job_id(self) -> int:
        return self._c.id

    @property
    def attempt(self) -> int:
        """1 for the first run; counts every claim, retries included."""
        return self._c.attempt

    @property
    def group(self) -> str:
        return self._c.group

    @property
    def type(self) -> str:
        return self._c.type

    @property
    def parent_id(self) -> int | None:
        return self._c.parent_id

    @property
    def queue(self) -> JobQueue:
        return self._q

    async def checkpoint(self, state: Any) -> None:
        """Save JSON progress; a later attempt starts with ``checkpointed == state``.

        Fenced like finalize: raises LeaseLostError if this attempt lost its lease."""
        check_json(state, "checkpoint state")
        J = self._db.t.jobs
        c = self._c

        async def write(conn: Any) -> int:
            res = await conn.execute(
                update(J).where(
                    J.c.id == c.id, J.c.attempts == c.attempt,
                    J.c.state.in_([lit(x) for x in S.LEASED_STATES]),
                    J.c.lease_owner == self._me,
                ).values(checkpoint=state)
            )
            return int(res.rowcount)

        if await self._db.write(write) != 1:
            raise LeaseLostError(f"job {c.id} attempt {c.attempt} no longer holds its lease")
        self.checkpointed = state

    async def progress(
        self, done: float, total: float | None = None, message: str | None = None
    ) -> None:
        """Report how far the job has got (``Job.progress``): cheap to call often, since
        reports are coalesced to at most one write per second (the last one always lands
        before the attempt's outcome). Fenced like ``checkpoint()``: raises LeaseLostError
        once this attempt lost its lease; InvalidJobError for a bad value."""
        if self._progress is None:
            self._progress = progress.Reporter(self._db, self._me, self._c)
        await self._progress.report(done, total, message)

    async def dependency_results(self) -> dict[int, Any]:
        """``{dependency id: result}`` of the jobs this one depends on; a dependency that is a
        container maps to ``{child id: result}`` of every leaf it holds (nested containers
        flattened)."""
        return await self._db.read(partial(fanin.dependency_results, self._db, job_id=self._c.id))

    def batch(self) -> Batch:
        """A batch to add jobs from inside the handler (a dynamic DAG)."""
        return self._q.batch()

    async def enqueue(self, type: str | Handler[..., Any], args: dict[str, Any] | None = None,
                      **options: Any) -> int:
        """Enqueue one more job from inside the handler."""
        return await self._q.enqueue(type, args, **options)


def _error(
    exc: BaseException, type_name: str | None = None, message: str | None = None
) -> dict[str, Any]:
    return {
        "type": type_name or type(exc).__name__,
        "message": message if message is not None else str(exc),
        "traceback": "".join(traceback.format_exception(exc))[-8000:],
    }


#: Why the worker cancelled an attempt, keyed by (job id, attempt).
Reasons = dict[tuple[int, int], str]


async def run_attempt(core: Core, c: Claimed, reasons: Reasons,
                      traced: bool = False) -> Outcome | None:
    """Run ``c`` to an Outcome. ``reasons[(c.id, c.attempt)]`` says why the worker cancelled
    it, if it did: "cancel" (cancel requested: the job ends cancelled), "lost" (the lease
    belongs to someone else: nothing to write), "shutdown" (graceful stop) or "expired" (the
    lease could not be renewed in time): both release the job so it runs again at once.
    A progress report it held back lands before the outcome is returned. Traced where
    OpenTelemetry records (aiojobqueue.tracing; ``traced``: inside its span).

    One coroutine for the whole attempt: every await of the handler passes through each
    frame between it and the event loop, and this runs for every job."""
    if not traced and tracing.tracer() is not None:
        return await tracing.traced_attempt(c, lambda: run_attempt(core, c, reasons, True))
    me = core.settings.worker_id
    spec = core.handlers.get(c.type)
    if spec is None:  # never claimed without a handler; defensive
        return Outcome(c.id, c.attempt, me, "failed", error={
            "type": "NoHandler", "message": f"no handler for {c.type!r}"}, retryable=False)
    if spec.params is not None:  # no re-run can make them fit: fail for good
        why = spec.params.mismatch(c.args)
        if why is not None:
            return Outcome(c.id, c.attempt, me, "failed", retryable=False, error={
                "type": "InvalidJobError", "message": f"args do not fit: {why}",
                "traceback": ""})
    ctx = core.make_context(c)
    limit = c.timeout if c.timeout is not None else spec.timeout
    tmo = asyncio.timeout(limit)
    outcome: Outcome | None
    try:
        async with tmo:
            result = await (threads.call_plain(core, spec.fn, ctx, c.args) if spec.plain
                            else spec.fn(ctx, **c.args))
    except asyncio.CancelledError:
        reason = reasons.get((c.id, c.attempt))
        if reason is None:
            if ctx._progress is not None:
                ctx._progress.abandon()
            raise
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        outcome = (Outcome(c.id, c.attempt, me, "cancelled") if reason == "cancel"
                   else Outcome(c.id, c.attempt, me, "released")
                   if reason in ("shutdown", "expired") else None)
    except Snooze as exc:  # back to scheduled, no attempt used (finalize.py, snooze.py)
        outcome = Outcome(c.id, c.attempt, me, "snoozed", retry_in=exc.seconds)
    except BaseException as exc:
        outcome = _failed(c, me, spec, exc, tmo.expired(), limit)
    else:
        outcome = (Outcome(c.id, c.attempt, me, "done") if result is None
                   else _done(c, me, result))
    if ctx._progress is not None:
        await ctx._progress.close(write=outcome is not None)
    return outcome


def _done(c: Claimed, me: str, result: Any) -> Outcome:
    if result is not None:
        try:
            check_json(result, f"result of {c.type!r}")
        except NotJSONError as exc:  # the same result again on a re-run: fail for good
            return Outcome(c.id, c.attempt, me, "failed", error=_error(exc), retryable=False)
    return Outcome(c.id, c.attempt, me, "done", result=result)


def _failed(c: Claimed, me: str, spec: HandlerSpec, exc: BaseException, expired: bool,
            limit: float | None) -> Outcome:
    if isinstance(exc, TimeoutError) and expired:  # a timeout is always retryable
        log.warning("job %s (%s) attempt %s timed out after %ss",
                    c.id, c.type, c.attempt, limit, extra=_extra(me, c))
        return Outcome(c.id, c.attempt, me, "failed",
                       error=_error(exc, "TimeoutError", f"timed out after {limit}s"))
    # The worker logs the outcome once committed (retry or failed for good); this one
    # carries the traceback for whoever debugs at DEBUG level.
    log.debug("job %s (%s) attempt %s raised %r", c.id, c.type, c.attempt, exc,
              extra=_extra(me, c), exc_info=exc)
    return Outcome(c.id, c.attempt, me, "failed", error=_error(exc),
                   retryable=spec.retryable(exc))


def _extra(me: str, c: Claimed) -> dict[str, Any]:
    return {"job_id": c.id, "job_type": c.type, "attempt": c.attempt, "worker": me,
            "group": c.group}

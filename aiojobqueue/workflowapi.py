"""The JobQueue methods of external steps (``enqueue_external``, ``complete``, ``fail``):
a mixin, so queue.py only names it. See external.py for the rules."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from . import external
from . import schema as S
from .batch import Batch, JobRef, check_id, check_json

if TYPE_CHECKING:
    from .core import Core


class _Queue(Protocol):
    """What the mixin uses of JobQueue."""

    def batch(self) -> Batch: ...

    def _started(self) -> Core: ...


class ExternalSteps:
    """``JobQueue``'s external-step methods."""

    async def enqueue_external(
        self: _Queue,
        type: str = "external",
        args: dict[str, Any] | None = None,
        *,
        group: str | None = None,
        timeout: timedelta | float | None = None,
        key: str | None = None,
        depends_on: Iterable[JobRef | int] = (),
        priority: int = 0,
        parent: JobRef | int | None = None,
    ) -> int:
        """Enqueue one external step (see ``Batch.external``) and return its id (with a
        live ``key``: the existing job's id)."""
        b = self.batch()
        ref = b.external(type, args, group=group, timeout=timeout, key=key,
                         depends_on=depends_on, priority=priority, parent=parent)
        await b.commit()
        return ref.id

    async def complete(self: _Queue, job_id: int, result: Any = None) -> None:
        """End the external step ``job_id`` as done with ``result`` (JSON): its dependents
        run as after any finished job. InvalidStateError, changing nothing, unless it is
        ``external`` now (already completed, failed, timed out, or still waiting for its
        dependencies, or not an external step); JobNotFoundError; NotJSONError."""
        check_json(result, "result")
        await _end(self._started(), job_id, S.DONE, result, None)

    async def fail(self: _Queue, job_id: int, error: str | dict[str, Any] | None = None
                   ) -> None:
        """End the external step ``job_id`` as failed (``error``: a message or a JSON dict):
        what waits on it is cancelled as after any failure. Refuses as ``complete()``."""
        await _end(self._started(), job_id, S.FAILED, None, external.failure(error))


async def _end(core: Core, job_id: int, state: str, result: Any,
               error: dict[str, Any] | None) -> None:
    check_id(job_id)
    await core.db.write(lambda conn: external.finish(core, conn, job_id, state, result, error))
    core.signals.wake()

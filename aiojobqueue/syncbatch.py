"""SyncBatch: ``Batch`` for synchronous code (``SyncQueue.batch()``). The same ``add``,
``container`` and ``external`` (the same checks); ``commit()`` drives the batch's insert to
its end in the caller's thread (``syncbridge.drive``: the insert never suspends)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from .batch import Batch, JobRef
from .handlers import Handler
from .syncbridge import drive


class SyncBatch:
    """``Batch`` for synchronous code: the same ``add`` and ``container`` (the same checks),
    inserted by ``commit()`` or on leaving ``with``."""

    def __init__(self, batch: Batch) -> None:
        self._batch = batch

    def add(
        self,
        type: str | Handler[..., Any],
        args: dict[str, Any] | None = None,
        *,
        group: str | None = None,
        weight: int | None = None,
        depends_on: Iterable[JobRef | int] = (),
        run_after: timedelta | datetime | float | None = None,
        priority: int = 0,
        timeout: float | None = None,
        max_attempts: int | None = None,
        key: str | None = None,
        parent: JobRef | int | None = None,
        when: str = "done",
        tags: Iterable[str] | None = None,
    ) -> JobRef:
        """Add a job (see ``Batch.add``; ``when``: its run condition)."""
        return self._batch.add(
            type, args, group=group, weight=weight, depends_on=depends_on,
            run_after=run_after, priority=priority, timeout=timeout,
            max_attempts=max_attempts, key=key, parent=parent, when=when, tags=tags)

    def container(
        self,
        type: str,
        *,
        group: str | None = None,
        weight: int | None = None,
        depends_on: Iterable[JobRef | int] = (),
        priority: int = 0,
        key: str | None = None,
        parent: JobRef | int | None = None,
    ) -> JobRef:
        """Add a container (see ``Batch.container``)."""
        return self._batch.container(type, group=group, weight=weight, depends_on=depends_on,
                                     priority=priority, key=key, parent=parent)

    def external(self, type: str = "external", args: dict[str, Any] | None = None,
                 **options: Any) -> JobRef:
        """Add an external step (see ``Batch.external``)."""
        return self._batch.external(type, args, **options)

    def commit(self) -> list[int]:
        """Insert everything added so far (called on leaving ``with``); the ids in order."""
        return drive(self._batch.commit())

    def __enter__(self) -> SyncBatch:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if et is None:
            self.commit()

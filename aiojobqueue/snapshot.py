"""A job as ``JobQueue.get`` returns it: one read of its row and its dependency edges,
turned into a ``Job`` (the progress and errors history decoded as their modules store them)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from . import history, progress
from . import schema as S
from .database import Database
from .errors import JobNotFoundError
from .models import Job, JobState
from .tags import tags_of


async def read_job(db: Database, job_id: int) -> Job:
    """A snapshot of job ``job_id``. Raises JobNotFoundError."""
    J, D = db.t.jobs, db.t.deps

    async def read(conn: AsyncConnection) -> Job:
        row = (await conn.execute(select(J).where(J.c.id == job_id))).first()
        if row is None:
            raise JobNotFoundError(f"no job with id {job_id}")
        deps = [r[0] for r in await conn.execute(
            select(D.c.depends_on_id).where(D.c.job_id == job_id).order_by(D.c.depends_on_id))]
        tags = (await tags_of(conn, db.t.tags, [job_id])).get(job_id, ())
        return to_job(row, deps, tags)

    return await db.read(read)


def to_job(row: Any, deps: list[int], tags: tuple[str, ...] = ()) -> Job:
    """The ``Job`` of a jobs row, its dependencies' ids and its tags."""
    errors, omitted = history.snapshot(row.errors)
    return Job(
        id=row.id, type=row.type, args=row.args, state=JobState(row.state), result=row.result,
        error=row.error, attempts=row.attempts, max_attempts=row.max_attempts,
        group=row.group_key, weight=row.weight, priority=row.priority, parent_id=row.parent_id,
        is_container=row.kind == S.CONTAINER, key=row.key, depends_on=tuple(deps),
        cancelled_by=row.cancelled_by, lease_owner=row.lease_owner, created_at=row.created_at,
        run_after=row.run_after, started_at=row.started_at, finished_at=row.finished_at,
        progress=progress.snapshot(row.progress), errors=errors, errors_omitted=omitted,
        snoozes=row.snoozes, is_external=row.kind == S.EXTERNAL_KIND,
        tags=tags,
        releases=row.releases, attempt_limit=row.attempt_limit,
    )

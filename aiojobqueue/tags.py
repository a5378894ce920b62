"""Tags: short labels on a job (``enqueue(..., tags=["invoice", "eu"])``), to find every job
of one invoice or customer, and to retry or cancel them together.

A tag is a row of the tags table (``job_id``, ``tag``) with an index on (``tag``, ``job_id``):
a filter by tag is one index range read newest first, whatever the size of the jobs table,
on every database. Tags are written in the job's insert transaction and deleted with the
job (``prune``, retention); they never change otherwise.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import Table, delete, insert, literal_column, select
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .errors import InvalidJobError, InvalidStateError, JobNotFoundError
from .sql import chunks

if TYPE_CHECKING:
    from .queue import JobQueue

#: The longest tag (the column is VARCHAR(100)).
MAX_LEN = 100
#: The most tags on one job: a tag is a label, not a document.
MAX_TAGS = 20
#: The most jobs one bulk action changes, by tag or from the dashboard (call it again for more).
BULK_MAX = 10_000


class InvalidTagError(InvalidJobError):
    """A tag that is not a non-empty string of at most ``MAX_LEN`` characters, or too many
    tags on one job. Nothing is inserted."""


def check_tags(tags: Any) -> tuple[str, ...]:
    """``tags`` as a tuple of distinct tags in their given order; raises InvalidTagError."""
    if tags is None:
        return ()
    if isinstance(tags, str) or not isinstance(tags, Iterable):
        raise InvalidTagError(f"tags must be a list of strings, not {tags!r}")
    out = tuple(dict.fromkeys(tags))
    for t in out:
        check_tag(t)
    if len(out) > MAX_TAGS:
        raise InvalidTagError(f"at most {MAX_TAGS} tags on one job, got {len(out)}")
    return out


def check_tag(tag: Any) -> str:
    """One tag (also a filter's): a non-empty string of <= MAX_LEN chars, no control chars."""
    if not isinstance(tag, str) or not tag or len(tag) > MAX_LEN:
        raise InvalidTagError(f"a tag must be a non-empty string of <= {MAX_LEN} chars: {tag!r}")
    if not tag.isprintable():
        raise InvalidTagError(f"a tag must not contain control characters: {tag!r}")
    return tag


async def insert_tags(conn: AsyncConnection, T: Table, pairs: Sequence[tuple[int, str]]) -> None:
    """Write (job_id, tag) pairs (inside the jobs' insert transaction)."""
    for part in chunks(pairs):
        await conn.execute(insert(T), [{"job_id": j, "tag": t} for j, t in part])


async def tags_of(conn: AsyncConnection, T: Table, ids: Sequence[int]
                  ) -> dict[int, tuple[str, ...]]:
    """The tags of each job of ``ids`` (a job without tags is absent), sorted."""
    out: dict[int, list[str]] = defaultdict(list)
    for part in chunks(ids):
        rows = await conn.execute(
            select(T.c.job_id, T.c.tag).where(T.c.job_id.in_(part))
            .order_by(T.c.job_id, T.c.tag))
        for jid, tag in rows:
            out[jid].append(tag)
    return {k: tuple(v) for k, v in out.items()}


async def delete_tags(conn: AsyncConnection, T: Table, ids: Sequence[int]) -> int:
    """Delete the tags of jobs being deleted; returns how many rows went."""
    n = 0
    for part in chunks(ids):
        n += int((await conn.execute(delete(T).where(T.c.job_id.in_(part)))).rowcount)
    return n


#: A side of a tag-and-state read with fewer rows than this is read whole (capped counts).
PROBE = 2000


async def tagged_ids(conn: AsyncConnection, J: Table, T: Table, tag: str,
                     states: Sequence[str], limit: int, cond: Sequence[Any] = ()) -> list[int]:
    """Ids (newest first, at most ``limit``) of jobs carrying ``tag`` in one of ``states``
    (and meeting ``cond``). Finished states with fewer than ``PROBE`` jobs (the usual bulk
    retry: a few failed jobs under a tag on 100k) are read from the (state, finished_at)
    index, then their tags by primary key; anything else from the (tag, job_id) index,
    newest first. (A planner left to choose may walk the whole primary key, or every row
    of a common tag: measured in bench/tags.py.)"""
    if all(s in S.TERMINAL for s in states):
        few: list[int] = []
        for st in states:  # literal states: the partial indexes match (see web/views.lit)
            few += [int(r[0]) for r in await conn.execute(
                select(J.c.id).where(J.c.state == literal_column(f"'{st}'"),
                                     J.c.finished_at.is_not(None), *cond).limit(PROBE))]
        if len(few) < PROBE:
            hits: list[int] = []
            for part in chunks(few):
                hits += [int(r[0]) for r in await conn.execute(select(T.c.job_id).where(
                    T.c.tag == tag, T.c.job_id.in_(part)))]
            return sorted(hits, reverse=True)[:limit]
    rows = await conn.execute(
        select(T.c.job_id).select_from(T).join(J, J.c.id == T.c.job_id)
        .where(T.c.tag == tag, J.c.state.in_(states), *cond)
        .order_by(T.c.job_id.desc()).limit(limit))
    return [int(r[0]) for r in rows]


@dataclass
class BulkResult:
    """What ``retry_tagged`` / ``cancel_tagged`` did."""

    tag: str
    #: Jobs the action changed.
    changed: list[int] = field(default_factory=list)
    #: Jobs skipped because they moved on meanwhile (each with the reason).
    skipped: list[str] = field(default_factory=list)
    #: More jobs matched than ``BULK_MAX``: call again for the rest.
    more: bool = False


async def matching(q: JobQueue, tag: str, states: Sequence[str], limit: int = BULK_MAX
                   ) -> list[int]:
    """Ids (newest first, at most ``limit``) of leaf jobs and containers carrying ``tag``
    whose state is one of ``states``."""
    check_tag(tag)
    J, T = q._t.jobs, q._t.tags

    return await q._read(lambda conn: tagged_ids(conn, J, T, tag, states, limit))


async def retry_tagged(q: JobQueue, tag: str) -> BulkResult:
    """Retry every failed or cancelled job carrying ``tag``, each as ``queue.retry`` (with
    the jobs its end cancelled). At most ``BULK_MAX`` per call (``more`` says so)."""

    core = q._started()

    async def one(jid: int) -> str | None:
        await q._write(lambda conn: core.actions.retry(conn, jid))
        core.signals.wake()
        return None

    return await _bulk(q, tag, (S.FAILED, S.CANCELLED), one)


async def cancel_tagged(q: JobQueue, tag: str) -> BulkResult:
    """Cancel every live job carrying ``tag``, each as ``queue.cancel`` (a running one is
    stopped by its worker within a heartbeat). At most ``BULK_MAX`` per call."""

    core = q._started()

    async def one(jid: int) -> str | None:
        state = await q._write(lambda conn: core.actions.cancel(conn, jid))
        # ended meanwhile (e.g. cancelled by an upstream cancelled just before)
        return f"job {jid} is already {state}" if state in (S.DONE, S.FAILED) else None

    return await _bulk(q, tag, S.LIVE, one)


async def _bulk(q: JobQueue, tag: str, states: Sequence[str],
                act: Callable[[int], Awaitable[str | None]]) -> BulkResult:
    ids = await matching(q, tag, states, BULK_MAX + 1)
    res = BulkResult(tag, more=len(ids) > BULK_MAX)
    for jid in ids[:BULK_MAX]:
        try:
            why = await act(jid)
        except (InvalidStateError, JobNotFoundError) as exc:  # moved on meanwhile
            why = str(exc)
        if why is None:
            res.changed.append(jid)
        else:
            res.skipped.append(why)
    return res

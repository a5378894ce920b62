"""The history of a job's failed attempts: ``Job.errors``.

Each failed attempt (an exception, a timeout, a lost lease found by the reclaimer) appends
``{"attempt", "type", "message", "traceback", "worker", "at"}`` to the job's ``errors``
column in the same UPDATE that records the failure (the retry's or the final one), so the
success path never writes it. Only the last ``KEEP`` attempts are kept; the column counts the
ones dropped before them. Stored as ``{"omitted": n, "items": [...]}`` with ISO times.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Table, select
from sqlalchemy.ext.asyncio import AsyncConnection

#: How many failed attempts a job keeps in full.
KEEP = 20


def entry(attempt: int, error: dict[str, Any] | None, worker: str | None) -> dict[str, Any]:
    """The record of one failed attempt, timed now (UTC)."""
    err = error or {}
    return {
        "attempt": attempt,
        "type": err.get("type"),
        "message": err.get("message"),
        "traceback": err.get("traceback"),
        "worker": worker,
        "at": datetime.now(UTC).isoformat(),
    }


def appended(stored: Any, new: dict[str, Any]) -> dict[str, Any]:
    """The column's value with ``new`` added, trimmed to the last KEEP attempts."""
    items = list(stored.get("items", ())) if isinstance(stored, dict) else []
    omitted = int(stored.get("omitted", 0)) if isinstance(stored, dict) else 0
    items.append(new)
    if len(items) > KEEP:
        omitted += len(items) - KEEP
        items = items[-KEEP:]
    return {"omitted": omitted, "items": items}


async def with_failure(
    conn: AsyncConnection, jobs: Table, job_id: int, attempt: int,
    error: dict[str, Any] | None, worker: str | None,
) -> dict[str, Any]:
    """The ``errors`` value to write with the failure of ``attempt``. The caller holds the
    job's row lock (the failure finalize reads it FOR UPDATE), so this read-modify-write
    cannot lose another attempt's entry."""
    stored = (await conn.execute(select(jobs.c.errors).where(jobs.c.id == job_id))).scalar()
    return appended(stored, entry(attempt, error, worker))


def snapshot(stored: Any) -> tuple[tuple[dict[str, Any], ...], int]:
    """(``Job.errors``, ``Job.errors_omitted``) from the stored column."""
    if not isinstance(stored, dict):
        return (), 0
    items = tuple({**e, "at": _when(e.get("at"))} for e in stored.get("items", ()))
    return items, int(stored.get("omitted", 0))


def _when(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    at = datetime.fromisoformat(value)
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)

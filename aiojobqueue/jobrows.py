"""A batch's job rows as the insert sends them: one insert level as columns (what a dialect's
bulk statement binds), the same as per-row parameters, and those rows split into the
statement shapes of the generic executemany INSERT (times on the database clock)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .batch import _Spec
from .database import Database
from .dialects.bulk import JobColumns
from .timeutil import db_now, utcnow_plus


def job_columns(
    level: Sequence[_Spec], parents: list[int | None], flagged: list[bool],
    errors: list[str | None],
) -> JobColumns:
    """One insert level as columns (see InsertPath.bulk): a list per field, not a
    dict per row, so a bulk path can bind each as one array."""
    delay: list[float | None] = []
    run_at: list[datetime | None] = []
    for s in level:
        ra = s.run_after
        if ra is None:
            delay.append(0.0)
            run_at.append(None)
        elif isinstance(ra, timedelta):
            delay.append(ra.total_seconds())
            run_at.append(None)
        else:
            delay.append(None)
            run_at.append(ra if ra.tzinfo else ra.replace(tzinfo=UTC))
    return {
        "type": [s.type for s in level],
        "kind": [S.CONTAINER if s.is_container else S.EXTERNAL_KIND if s.is_external
                 else S.WHEN_KINDS[s.when] for s in level],
        "state": [s.state for s in level],
        "args": [s.args for s in level],
        "parent_id": parents,
        "group_key": [s.group for s in level],
        "weight": [s.weight for s in level],
        "priority": [s.priority for s in level],
        "pending": [s.pending for s in level],
        "max_attempts": [s.max_attempts for s in level],
        "timeout": [s.timeout for s in level],
        "key": [s.key for s in level],
        "cancelled_by": [s.cancelled_by for s in level],
        "has_dependents": flagged,
        "error": errors,
        "delay": delay,
        "run_at": run_at,
        "dead": [s.state == S.CANCELLED for s in level],
        "trace": [s.trace for s in level],  # NULL unless tracing.traced_insert set it
    }


def job_rows(cols: JobColumns) -> list[dict[str, Any]]:
    """Columns back to the per-row parameters of the generic executemany insert."""
    out = []
    for i in range(len(cols["type"])):
        dead = cols["dead"][i]
        out.append({
            "type": cols["type"][i],
            "kind": cols["kind"][i],
            "state": cols["state"][i],
            "args_json": cols["args"][i],
            "parent_id": cols["parent_id"][i],
            "group_key": cols["group_key"][i],
            "weight": cols["weight"][i],
            "priority": cols["priority"][i],
            "pending": cols["pending"][i],
            "run_after": cols["run_at"][i],
            "_delay": cols["delay"][i],
            "_dead": dead,
            "attempts": 0,
            "max_attempts": cols["max_attempts"][i],
            "attempt_limit": cols["max_attempts"][i],
            "timeout": cols["timeout"][i],
            "key": cols["key"][i],
            "live_key": None if dead else cols["key"][i],
            "cancelled_by": cols["cancelled_by"][i],
            "has_dependents": cols["has_dependents"][i],
            "error_json": cols["error"][i],
            "trace_json": cols["trace"][i],
        })
    return out


def _insert_stmt(db: Database, **values: Any) -> Any:
    """INSERT into jobs with args/error bound as the JSON text encoded at add() (no second
    encoding by the JSON type)."""
    as_json = db.ops.json_param
    return insert(db.t.jobs).values(
        args=as_json("args_json"), error=as_json("error_json"), trace=as_json("trace_json"),
        **values
    )


def _with_times(row: dict[str, Any], now: Any) -> dict[str, Any]:
    """A row's created/run_after/finished times: SQL on the database clock (``now`` is
    db_now()) or, given a fetched ``now`` datetime, plain values."""
    r = dict(row)
    delay, dead = r.pop("_delay"), r.pop("_dead")
    if isinstance(now, datetime):
        if delay is not None:
            r["run_after"] = now + timedelta(seconds=delay)
    elif delay is not None:
        r["run_after"] = utcnow_plus(delay)
    r["created_at"] = now
    r["finished_at"] = now if dead else None
    return r


async def row_shapes(
    db: Database, conn: AsyncConnection, rows: list[dict[str, Any]]
) -> list[tuple[list[int], Any, list[dict[str, Any]]]]:
    """Split rows into statement shapes: (row indexes, INSERT, executemany params). The
    common rows take their times from the database clock inside the INSERT; the rare ones
    (absolute run_after, born cancelled) a clock read once."""
    common = [i for i, r in enumerate(rows) if r["_delay"] is not None and not r["_dead"]]
    rare = [i for i, r in enumerate(rows) if r["_delay"] is None or r["_dead"]]
    out: list[tuple[list[int], Any, list[dict[str, Any]]]] = []
    if common:
        stmt = db.stmt("insert_common", lambda: _insert_stmt(
            db, created_at=db_now(), finished_at=None, run_after=utcnow_plus(bindparam("_delay"))
        ))
        out.append((common, stmt, [{k: v for k, v in rows[i].items()
                                    if k not in ("_dead", "run_after")} for i in common]))
    if rare:
        now = (await conn.execute(select(db_now()))).scalar_one()
        out.append((rare, _insert_stmt(db), [_with_times(rows[i], now) for i in rare]))
    return out

"""Bulk insert, the dialect's side: jobs as columns (``JobColumns``), the path a queue's
inserts take (``InsertPath``: a lone enqueue, one statement per level, or SQLAlchemy's
executemany), the insert hooks every dialect starts from (``InsertHooks``, which
``DialectOps`` inherits) and the helpers the dialects' JSON-rows statements share.

insert.py (dialect-neutral) turns specs into columns and drives this path; each dialect
module overrides the hooks with its own bulk statement (``insert_jobs``) and, where it
differs, gives its own path (``DialectOps.insert_path``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, Table, insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.compiler import InsertmanyvaluesSentinelOpts

from ..schema import Tables

if TYPE_CHECKING:
    from .base import DialectOps

#: Jobs to insert as one list per field (see InsertHooks.insert_jobs): type, kind, state,
#: args (JSON text), parent_id, group_key, weight, priority, pending, max_attempts, timeout,
#: key, cancelled_by, has_dependents, error and trace (JSON text or None); and the times: delay
#: (seconds from the database's now, or None) or run_at (an absolute run_after); dead (born
#: cancelled: finished now, no live_key). attempts start at 0, attempt_limit = max_attempts.
JobColumns = dict[str, list[Any]]
#: Edges per executemany call (InsertHooks.insert_edges).
EDGE_CHUNK = 2500
#: rows per executemany call of InsertPath.rows (x5 where RETURNING comes back)
ROWS_CHUNK = 1000
JOB_FIELDS = (
    "type", "kind", "state", "args", "parent_id", "group_key", "weight", "priority", "pending",
    "max_attempts", "timeout", "key", "cancelled_by", "has_dependents", "error", "delay",
    "run_at", "dead", "trace",
)


def varying_fields(cols: JobColumns) -> frozenset[str]:
    """The fields whose value is not the same on every row (a bulk statement binds the
    others once). With more than one row, args always counts as varying, so the statement
    always has one per-row field to number its rows by."""
    n = len(cols["args"])
    if n == 1:
        return frozenset()
    return frozenset(
        name for name, vals in cols.items() if name == "args" or vals.count(vals[0]) != n
    )


def json_rows_params(cols: JobColumns, varying: list[str]) -> dict[str, Any]:
    """Parameters of a JSON-rows bulk INSERT (SQLite json_each, MariaDB JSON_TABLE): every
    constant field bound once, the varying ones as one JSON array of rows, ``rows``."""
    params = {name: vals[0] for name, vals in cols.items() if name not in varying}
    params["rows"] = json.dumps(list(zip(*(cols[name] for name in varying), strict=True)))
    return params


async def run_bulk_insert(
    conn: AsyncConnection, sql: str, params: dict[str, Any], n: int
) -> list[int]:
    """Run a bulk INSERT ... RETURNING id of ``n`` rows; the ids sorted (drawn in row order)."""
    got = sorted(r[0] for r in await conn.exec_driver_sql(sql, params))
    if len(got) != n:  # pragma: no cover - defensive
        raise RuntimeError("bulk INSERT returned the wrong number of ids")
    return got


class InsertHooks:
    """The insert half of DialectOps (a mixin: it needs ``t``): which path the inserts
    take, the bulk statement for jobs and the edges' insert."""

    t: Tables

    def insert_path(self) -> InsertPath:
        """How jobs are inserted (see insert.py)."""
        return InsertPath(self)  # type: ignore[arg-type]  # (always a DialectOps)

    async def insert_jobs(
        self, conn: AsyncConnection, cols: JobColumns, wake: bool
    ) -> list[int] | None:
        """Insert jobs in one bulk statement and return their ids in order, sending the
        wake-up from that statement when ``wake``; or None where the dialect has no bulk path
        (InsertPath.rows then runs SQLAlchemy's executemany INSERT)."""
        return None

    async def insert_edges(
        self, conn: AsyncConnection, job_ids: list[int], up_ids: list[int]
    ) -> None:
        """Insert the dependency edges ``job_ids[i]`` -> ``up_ids[i]`` (executemany; a
        dialect with an array type binds them as two arrays in one statement)."""
        D = self.t.deps
        for i in range(0, len(job_ids), EDGE_CHUNK):
            await conn.execute(insert(D), [
                {"job_id": j, "depends_on_id": u}
                for j, u in zip(job_ids[i : i + EDGE_CHUNK], up_ids[i : i + EDGE_CHUNK],
                                strict=True)
            ])


class InsertPath:
    """How jobs reach the table (see insert.py): ``alone``, a lone enqueue as one statement
    in autocommit (None: none here); ``bulk``, one level of a batch as one statement (None:
    none here); ``rows``, SQLAlchemy's executemany INSERT, returning the new ids in order."""

    #: ``alone(engine, cols, wake)``: the ids, the jobs committed; or None (nothing written)
    alone: Callable[[AsyncEngine, JobColumns, bool], Awaitable[list[int] | None]] | None = None
    #: ``alone_sync(engine, cols, wake)``: ``alone`` on a sync engine in autocommit
    #: (SyncQueue's), the ids; None: none here
    alone_sync: Callable[[Engine, JobColumns, bool], list[int]] | None = None

    def __init__(self, ops: DialectOps) -> None:
        self.ops = ops

    async def bulk(self, conn: AsyncConnection, cols: JobColumns, wake: bool) -> list[int] | None:
        """InsertHooks.insert_jobs: the ids, or None where there is no bulk statement."""
        return await self.ops.insert_jobs(conn, cols, wake)

    async def rows(self, conn: AsyncConnection, jobs: Table, stmt: Any,
                   params: list[dict[str, Any]], extra: list[Any]) -> list[int]:
        """Insert ``params`` by ``stmt`` (executemany), RETURNING their ids in order (and
        ``extra`` in the first statement: the wake-up)."""
        dialect = conn.dialect
        ordered = dialect.insert_executemany_returning_sort_by_parameter_order and bool(
            dialect.insertmanyvalues_implicit_sentinel
            & InsertmanyvaluesSentinelOpts.ANY_AUTOINCREMENT)
        step = ROWS_CHUNK * 5
        ids: list[int] = []
        for c in range(0, len(params), step):
            chunk = params[c : c + step]
            if ordered:
                res = await conn.execute(
                    stmt.returning(jobs.c.id, *extra, sort_by_parameter_order=True), chunk)
                ids += [r[0] for r in res.all()]
            else:
                # Without an implicit sentinel SQLAlchemy would send ordered RETURNING one row
                # per statement. Unordered, it sends multi-row INSERTs in order; under the
                # write lock each numbers its rows upwards in VALUES order, so the sorted ids
                # are the rows' ids.
                res = await conn.execute(stmt.returning(jobs.c.id, *extra), chunk)
                got = sorted(r[0] for r in res.all())
                if len(got) != len(chunk):  # pragma: no cover - defensive
                    raise RuntimeError("multi-row INSERT returned the wrong number of ids")
                ids += got
            extra = []
        return ids

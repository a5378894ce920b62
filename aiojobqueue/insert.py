"""Bulk insert: a batch's jobs, edges and groups in one transaction (or, for plain jobs, one
statement in autocommit where the dialect has one). How rows reach the table is the
dialect's ``InsertPath``: one bulk statement per level where it has one, else SQLAlchemy's
executemany INSERT."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, bindparam, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from . import external, tracing
from . import schema as S
from .batch import JobRef, Node, Ref, _Spec
from .dag import plan_graph
from .database import Database
from .dialects.bulk import InsertPath, JobColumns
from .errors import InvalidJobError
from .groups import GroupRows
from .settle import Settler
from .signals import Signals
from .tags import insert_tags
from .timeutil import db_now, utcnow_plus

CHUNK = 1000
BULK_ROWS = 10 * CHUNK  # rows per bulk INSERT statement (InsertPath.bulk)


class Inserter:
    """Inserts batches (see the module docstring)."""

    def __init__(self, db: Database, settler: Settler, signals: Signals) -> None:
        self.db = db
        #: the ``groups`` rows this process knows exist
        self.groups = GroupRows(db)
        self.settler = settler
        self.signals = signals
        self.path: InsertPath = db.ops.insert_path()

    async def insert(
        self, specs: list[_Spec], connection: AsyncConnection | AsyncSession | None,
        traced: bool = False,
    ) -> list[int]:
        """Insert ``specs``: on ``connection`` (the caller's transaction) if given, else in a
        transaction of their own (a race on a key with a concurrent insert: looked at
        again), waking the local worker when one of them is ready. Traced where
        OpenTelemetry records (aiojobqueue.tracing; ``traced``: inside its span)."""
        if not traced and tracing.tracer() is not None:
            return await tracing.traced_insert(
                specs, lambda: self.insert(specs, connection, True))
        if connection is not None:
            if isinstance(connection, AsyncSession):
                conn = await connection.connection()
            else:
                conn = connection
            await self.db.ops.begin_write(conn)  # (SQLite: what it reads stays true)
            ids, _ = await self.insert_specs(conn, specs)
            return ids
        if self.path.alone is not None and self._lone(specs):
            # One INSERT statement does it all (times from the database clock, the wake-up
            # in the same statement): it is atomic by itself, so skip BEGIN and COMMIT.
            done = await self.insert_alone(specs)
            if done is not None:
                ids, any_ready = done
                if any_ready:
                    self.signals.wake()
                return ids
        for attempt in range(3):
            try:
                ids, any_ready = await self.db.write(lambda conn: self.insert_specs(conn, specs))
                if any_ready:
                    self.signals.wake()  # a worker in this process starts it at once
                return ids
            except IntegrityError:  # a concurrent insert took the same key: look again
                if attempt == 2:
                    raise
                for s in specs:
                    s.ref._id = None
        raise AssertionError("unreachable")

    def _lone(self, specs: list[_Spec]) -> bool:
        """Jobs whose insert is a single statement: no key, edge, parent or container, a
        group already known to exist, no absolute run_after, and few enough for one bulk
        statement (a bulk load's chunk of 1,000 is one round trip, not BEGIN, INSERT,
        COMMIT)."""
        known = self.groups.known
        return len(specs) <= BULK_ROWS and all(
            s.key is None and not s.depends_on and s.parent is None and not s.is_container
            and not s.is_external and s.when == "done"
            and not s.tags and s.group in known and not isinstance(s.run_after, datetime)
            for s in specs
        )

    async def insert_specs(
        self, conn: AsyncConnection, specs: Sequence[_Spec]
    ) -> tuple[list[int], bool]:
        """Insert ``specs`` on ``conn`` (inside a transaction). Returns (ids, any_ready)."""
        J = self.db.t.jobs
        own = {id(s.ref) for s in specs}

        def is_new(r: Ref) -> bool:
            return isinstance(r, JobRef) and id(r) in own

        def ext_id(r: Ref) -> int:
            return r.id if isinstance(r, JobRef) else int(r)

        # 1. uniqueness keys: a live job with the same key stands in for the new one.
        dedup: dict[int, int] = {}  # index -> existing id
        keyed = [s for s in specs if s.key is not None]
        if keyed:
            keys = sorted({s.key for s in keyed if s.key is not None})
            found: dict[str, int] = {}
            for i in range(0, len(keys), CHUNK):
                rows = await conn.execute(
                    select(J.c.live_key, J.c.id).where(J.c.live_key.in_(keys[i : i + CHUNK]))
                )
                found.update({r.live_key: r.id for r in rows})
            seen: set[str] = set()
            for s in keyed:
                assert s.key is not None
                if s.key in found:
                    dedup[s.ref._index] = found[s.key]
                    s.ref._id = found[s.key]
                elif s.key in seen:
                    raise InvalidJobError(f"key {s.key!r} appears twice in one batch")
                else:
                    seen.add(s.key)
        fresh = [s for s in specs if s.ref._index not in dedup]
        if not fresh:
            return [s.ref.id for s in specs], False

        def node(r: Ref) -> Node:
            """Graph node: ("n", index) for a fresh job, ("e", id) for an existing one."""
            if is_new(r):
                assert isinstance(r, JobRef)
                if r._index in dedup:
                    return ("e", dedup[r._index])
                return ("n", r._index)
            return ("e", ext_id(r))

        def resolve(n: Node) -> int:
            return by_index[n[1]].ref.id if n[0] == "n" else n[1]

        # Each ref resolved once (the graph work below looks at every edge several times).
        for s in fresh:
            s.node = node(s.ref)
            if s.depends_on:  # the same upstream listed twice is one edge
                s.dep_nodes = list(dict.fromkeys(node(d) for d in s.depends_on))
            s.parent_node = node(s.parent) if s.parent is not None else None
        by_index = {s.ref._index: s for s in fresh}
        existing: dict[int, Any] = {}
        ups: set[tuple[str, int]] = set()
        # A batch without edges or parents (the common bulk load) has nothing to lock, cannot
        # form a cycle and is one level: skip the graph work below.
        graph = any(s.depends_on or s.parent is not None or s.when != "done" for s in fresh)
        if graph:
            levels = await plan_graph(self.db, conn, fresh, existing, ups)
        else:
            for s in fresh:
                s.state = (S.ACTIVE if s.is_container else S.EXTERNAL if s.is_external
                           else S.SCHEDULED if s.run_after is not None else S.READY)
            levels = [fresh]

        any_ready = any(s.state == S.READY for s in fresh)
        wake = any_ready  # the wake-up rides on the first INSERT where the dialect can (below)
        # (a level of more than BULK_ROWS goes in slices: bounded statement and parameter size)
        levels = [lvl[i : i + BULK_ROWS] for lvl in levels for i in range(0, len(lvl), BULK_ROWS)]
        for level in levels:
            n = len(level)
            if graph:
                parents = [resolve(s.parent_node) if s.parent_node is not None else None
                           for s in level]
                flagged = [s.node in ups for s in level]
                errors = [
                    json.dumps({"type": "UpstreamFailed", "message": f"upstream {s.cancelled_by} "
                                f"{existing[s.cancelled_by].state}"})
                    if s.state == S.CANCELLED and s.cancelled_by else None
                    for s in level
                ]
            else:
                parents, flagged, errors = [None] * n, [False] * n, [None] * n
            cols = _columns(level, parents, flagged, errors)
            ids = await self.path.bulk(conn, cols, wake)
            if ids is not None:
                wake = False  # sent by the bulk statement
            else:
                ids = await self._insert_rows(conn, _rows(cols), wake)
                wake = wake and self.db.ops.notify_expr() is None
            for s, new_id in zip(level, ids, strict=True):
                s.ref._id = new_id
        armed = [s.ref.id for s in fresh if s.state == S.EXTERNAL]
        if armed:  # their deadlines, from now (external.py)
            await external.arm(self.db, conn, armed)
        if graph:
            edges = [(s.ref.id, resolve(d)) for s in fresh for d in s.dep_nodes]
            await self.db.ops.insert_edges(conn, [j for j, _ in edges], [u for _, u in edges])
        pairs = [(s.ref.id, t) for s in fresh for t in s.tags]
        if pairs:
            await insert_tags(conn, self.db.t.tags, pairs)
        groups = sorted({s.group for s in fresh if not s.is_container})
        if groups:
            await self.groups.ensure(conn, groups)
        # containers that start active with no children are finished at once (roll-up).
        empty = [s.ref.id for s in fresh if s.is_container and s.state == S.ACTIVE]
        if empty:
            # finished at once: release what waits on them (and roll up their parents) too
            await self.settler.settle(conn, await self.settler.rollup(conn, empty))
        if wake:
            await self.db.ops.notify(conn)
        return [s.ref.id for s in specs], any_ready

    async def insert_alone(self, specs: Sequence[_Spec]) -> tuple[list[int], bool] | None:
        """Plain jobs (see _lone: no key, edge, parent or container, a known group)
        as one bulk statement of their own, in autocommit: one round trip and none of the
        planning above. Returns (ids, any_ready) like insert_specs, or None where the dialect
        has no such statement (then the caller runs a transaction)."""
        alone = self.path.alone
        if alone is None:
            return None
        n = len(specs)
        for s in specs:
            s.state = S.SCHEDULED if s.run_after is not None else S.READY
        any_ready = any(s.state == S.READY for s in specs)
        cols = _columns(specs, [None] * n, [False] * n, [None] * n)
        ids = await alone(self.db.engine, cols, any_ready)
        if ids is None:
            return None
        for s, new_id in zip(specs, ids, strict=True):
            s.ref._id = new_id
        return ids, any_ready

    def insert_alone_sync(self, engine: Engine, specs: Sequence[_Spec]
                          ) -> tuple[list[int], bool] | None:
        """insert_alone for SyncQueue: the dialect's lone statement on a sync ``engine`` in
        autocommit (InsertPath.alone_sync); None where it has none (nothing written)."""
        alone = self.path.alone_sync
        if alone is None:
            return None
        n = len(specs)
        for s in specs:
            s.state = S.SCHEDULED if s.run_after is not None else S.READY
        any_ready = any(s.state == S.READY for s in specs)
        ids = alone(engine, _columns(specs, [None] * n, [False] * n, [None] * n), any_ready)
        for s, new_id in zip(specs, ids, strict=True):
            s.ref._id = new_id
        return ids, any_ready

    async def _insert_rows(
        self, conn: AsyncConnection, rows: list[dict[str, Any]], wake: bool = False
    ) -> list[int]:
        """Insert job rows (from insert_specs) and return their ids in order, executemany (see
        InsertPath.rows). ``wake``: also send the dialect's wake-up from the first statement
        when it can (see DialectOps.notify_expr)."""
        notify = self.db.ops.notify_expr() if wake else None
        extra = [notify] if notify is not None else []
        ids: dict[int, int] = {}
        for idx, stmt, params in await _shapes(self.db, conn, rows):
            got = await self.path.rows(conn, self.db.t.jobs, stmt, params, extra)
            ids.update(zip(idx, got, strict=True))
            extra = []
        return [ids[i] for i in range(len(rows))]


def _columns(
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


def _rows(cols: JobColumns) -> list[dict[str, Any]]:
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


async def _shapes(
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

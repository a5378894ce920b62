"""Bulk insert: a batch's jobs, edges and groups in one transaction (or, for plain jobs, one
statement in autocommit where the dialect has one). How rows reach the table is the
dialect's ``InsertPath``: one bulk statement per level where it has one, else SQLAlchemy's
executemany INSERT (the rows and statement shapes for both: jobrows.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from . import external, tracing
from . import schema as S
from .batch import JobRef, Node, Ref, _Spec
from .dag import plan_graph
from .database import Database
from .dialects.bulk import InsertPath
from .errors import InvalidJobError
from .groups import GroupRows
from .jobrows import job_columns, job_rows, row_shapes
from .settle import Settler
from .signals import Signals
from .sql import CHUNK, chunks
from .tags import insert_tags

#: rows per bulk INSERT statement (InsertPath.bulk): ten id lists' worth
BULK_ROWS = 10 * CHUNK


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
        # 1. uniqueness keys: a live job with the same key stands in for the new one.
        dedup = await self._match_keys(conn, specs)
        fresh = [s for s in specs if s.ref._index not in dedup]
        if not fresh:
            return [s.ref.id for s in specs], False
        _set_nodes(specs, fresh, dedup)
        # A batch without edges or parents (the common bulk load) has nothing to lock, cannot
        # form a cycle and is one level: skip the graph work below.
        graph: _Graph | None = None
        if any(s.depends_on or s.parent is not None or s.when != "done" for s in fresh):
            graph = _Graph({s.ref._index: s for s in fresh})
            levels = await plan_graph(self.db, conn, fresh, graph.existing, graph.ups)
        else:
            for s in fresh:
                s.state = (S.ACTIVE if s.is_container else S.EXTERNAL if s.is_external
                           else S.SCHEDULED if s.run_after is not None else S.READY)
            levels = [fresh]

        any_ready = any(s.state == S.READY for s in fresh)
        # the wake-up rides on the first INSERT where the dialect can (_insert_levels)
        wake = await self._insert_levels(conn, levels, graph, any_ready)
        await self._insert_related(conn, fresh, graph)
        if wake:
            await self.db.ops.notify(conn)
        return [s.ref.id for s in specs], any_ready

    async def _match_keys(self, conn: AsyncConnection, specs: Sequence[_Spec]) -> dict[int, int]:
        """The specs whose key a live job holds: index -> that job's id (set as their ref's
        id). A key twice in the batch is refused."""
        J = self.db.t.jobs
        dedup: dict[int, int] = {}  # index -> existing id
        keyed = [s for s in specs if s.key is not None]
        if keyed:
            keys = sorted({s.key for s in keyed if s.key is not None})
            found: dict[str, int] = {}
            for part in chunks(keys):
                rows = await conn.execute(
                    select(J.c.live_key, J.c.id).where(J.c.live_key.in_(part))
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
        return dedup

    async def _insert_levels(
        self, conn: AsyncConnection, levels: list[list[_Spec]], graph: _Graph | None,
        wake: bool,
    ) -> bool:
        """Insert the job rows level by level and set each ref's id. ``wake``: send the
        wake-up with the first INSERT where the dialect can; returns whether it is still
        to send."""
        # (a level of more than BULK_ROWS goes in slices: bounded statement and parameter size)
        levels = [lvl[i : i + BULK_ROWS] for lvl in levels for i in range(0, len(lvl), BULK_ROWS)]
        for level in levels:
            n = len(level)
            if graph is not None:
                parents, flagged, errors = graph.level_facts(level)
            else:
                parents, flagged, errors = [None] * n, [False] * n, [None] * n
            cols = job_columns(level, parents, flagged, errors)
            ids = await self.path.bulk(conn, cols, wake)
            if ids is not None:
                wake = False  # sent by the bulk statement
            else:
                ids = await self._insert_rows(conn, job_rows(cols), wake)
                wake = wake and self.db.ops.notify_expr() is None
            for s, new_id in zip(level, ids, strict=True):
                s.ref._id = new_id
        return wake

    async def _insert_related(
        self, conn: AsyncConnection, fresh: Sequence[_Spec], graph: _Graph | None
    ) -> None:
        """What goes with the inserted jobs: external steps' deadlines, edges, tags, groups;
        and containers that start with no children finished at once."""
        armed = [s.ref.id for s in fresh if s.state == S.EXTERNAL]
        if armed:  # their deadlines, from now (external.py)
            await external.arm(self.db, conn, armed)
        if graph is not None:
            edges = [(s.ref.id, graph.resolve(d)) for s in fresh for d in s.dep_nodes]
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
        cols = job_columns(specs, [None] * n, [False] * n, [None] * n)
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
        ids = alone(engine, job_columns(specs, [None] * n, [False] * n, [None] * n), any_ready)
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
        for idx, stmt, params in await row_shapes(self.db, conn, rows):
            got = await self.path.rows(conn, self.db.t.jobs, stmt, params, extra)
            ids.update(zip(idx, got, strict=True))
            extra = []
        return [ids[i] for i in range(len(rows))]


def _set_nodes(specs: Sequence[_Spec], fresh: Sequence[_Spec], dedup: dict[int, int]) -> None:
    """Resolve each fresh spec's refs once to graph nodes (the graph work looks at every edge
    several times): ("n", index) for a fresh job, ("e", id) for an existing one (a job of
    the batch whose key matched ``dedup``'s included)."""
    own = {id(s.ref) for s in specs}

    def node(r: Ref) -> Node:
        if isinstance(r, JobRef) and id(r) in own:
            if r._index in dedup:
                return ("e", dedup[r._index])
            return ("n", r._index)
        return ("e", r.id if isinstance(r, JobRef) else int(r))

    for s in fresh:
        s.node = node(s.ref)
        if s.depends_on:  # the same upstream listed twice is one edge
            s.dep_nodes = list(dict.fromkeys(node(d) for d in s.depends_on))
        s.parent_node = node(s.parent) if s.parent is not None else None


@dataclass(slots=True)
class _Graph:
    """A batch with edges or parents, as plan_graph left it: the fresh specs by index, the
    existing jobs it refers to (their rows), and every upstream."""

    by_index: dict[int, _Spec]
    existing: dict[int, Any] = field(default_factory=dict)
    ups: set[Node] = field(default_factory=set)

    def resolve(self, n: Node) -> int:
        """A node's job id (a fresh one's once its level is inserted)."""
        return self.by_index[n[1]].ref.id if n[0] == "n" else n[1]

    def level_facts(
        self, level: Sequence[_Spec]
    ) -> tuple[list[int | None], list[bool], list[str | None]]:
        """A level's parent ids, has_dependents flags and errors (a job born cancelled names
        the upstream that cancels it)."""
        parents = [self.resolve(s.parent_node) if s.parent_node is not None else None
                   for s in level]
        flagged = [s.node in self.ups for s in level]
        errors = [
            json.dumps({"type": "UpstreamFailed", "message": f"upstream {s.cancelled_by} "
                        f"{self.existing[s.cancelled_by].state}"})
            if s.state == S.CANCELLED and s.cancelled_by else None
            for s in level
        ]
        return parents, flagged, errors

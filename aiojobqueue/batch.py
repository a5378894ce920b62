"""DAG building and the one-transaction bulk insert."""

from __future__ import annotations

import json
import math
import uuid
from collections import defaultdict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.sql.compiler import InsertmanyvaluesSentinelOpts

from . import schema as S
from .dialects.base import JobColumns
from .errors import (
    ContainerClosedError,
    DependencyCycleError,
    InvalidJobError,
    JobNotFoundError,
    NotJSONError,
)
from .timeutil import db_now, utcnow_plus

if TYPE_CHECKING:
    from .queue import JobQueue

CHUNK = 1000
BULK_ROWS = 10 * CHUNK  # rows per bulk INSERT statement (DialectOps.insert_jobs)
MAX_ID = 2**63 - 1  # BIGINT / SQLite INTEGER
# weight, priority, max_attempts are INTEGER columns: 32 bits on PostgreSQL and MySQL, so a
# larger value is refused here on every database rather than by one driver (untyped).
MAX_INT = 2**31 - 1


class UnknownJobError(InvalidJobError, JobNotFoundError):
    """``depends_on`` or ``parent`` names a job id that does not exist."""


# One encoder for every check (json.dumps with an option builds a new encoder per call);
# its output is what json.dumps gives, and what the JSON column type would have stored.
_ENCODE = json.JSONEncoder(allow_nan=False).encode


def check_json(value: Any, what: str) -> str:
    """Serialize strictly (no NaN, only JSON types) or raise NotJSONError."""
    try:
        return _ENCODE(value)
    except (TypeError, ValueError) as exc:
        raise NotJSONError(f"{what} is not JSON-serializable: {exc}") from None


@dataclass(eq=False, slots=True)
class JobRef:
    """A job added to a batch; ``.id`` is known once the batch has been inserted."""

    _batch: Batch
    _index: int
    type: str
    is_container: bool
    _id: int | None = None

    @property
    def id(self) -> int:
        if self._id is None:
            raise InvalidJobError("this job has no id yet: the batch has not been inserted")
        return self._id

    def __repr__(self) -> str:
        return f"JobRef({self.type!r}, id={self._id})"


Ref = JobRef | int
#: A job in the batch's graph: ("n", index) for a fresh one, ("e", id) for an existing one.
Node = tuple[str, int]


@dataclass(slots=True)
class _Spec:
    ref: JobRef
    type: str
    args: str  # the JSON text, encoded once when added (validated and bound as is)
    group: str
    weight: int
    priority: int
    timeout: float | None
    max_attempts: int
    key: str | None
    run_after: timedelta | datetime | None
    depends_on: list[Ref]
    parent: Ref | None
    is_container: bool
    # filled during insert: graph nodes (see insert_specs), state, pending counter
    node: Node = ("n", 0)
    dep_nodes: list[Node] = field(default_factory=list)
    parent_node: Node | None = None
    state: str = ""
    pending: int = 0
    cancelled_by: int | None = None


class Batch:
    """Collects jobs and containers, then inserts them as one DAG in one transaction.

    Use ``async with queue.batch() as b:``; the insert happens when the block exits
    without an exception. With ``connection=`` the insert joins the caller's transaction and
    the jobs exist if and only if the caller commits.
    """

    def __init__(self, queue: JobQueue, connection: AsyncConnection | AsyncSession | None = None):
        self._q = queue
        self._conn = connection
        self._specs: list[_Spec] = []
        self._done = False

    # -- building ---------------------------------------------------------------------------
    def add(
        self,
        type: str,
        args: dict[str, Any] | None = None,
        *,
        group: str | None = None,
        weight: int = 1,
        depends_on: Iterable[Ref] = (),
        run_after: timedelta | datetime | float | None = None,
        priority: int = 0,
        timeout: float | None = None,
        max_attempts: int | None = None,
        key: str | None = None,
        parent: Ref | None = None,
    ) -> JobRef:
        """Add a job; returns a ref usable in ``depends_on``/``parent`` of later adds."""
        return self._add(
            type, {} if args is None else args, False, group, weight, depends_on, run_after,
            priority, timeout, max_attempts, key, parent,
        )

    def container(
        self,
        type: str,
        *,
        group: str | None = None,
        weight: int = 1,
        depends_on: Iterable[Ref] = (),
        priority: int = 0,
        key: str | None = None,
        parent: Ref | None = None,
    ) -> JobRef:
        """Add a container: it never runs; it is done when all its children are done."""
        return self._add(
            type, {}, True, group, weight, depends_on, None, priority, None, 1, key, parent
        )

    def _add(
        self,
        type: str,
        args: Any,
        is_container: bool,
        group: str | None,
        weight: int,
        depends_on: Iterable[Ref],
        run_after: timedelta | datetime | float | None,
        priority: int,
        timeout: float | None,
        max_attempts: int | None,
        key: str | None,
        parent: Ref | None,
    ) -> JobRef:
        if self._done:
            raise InvalidJobError("this batch has already been inserted")
        if not isinstance(type, str) or not type or len(type) > 200:
            raise InvalidJobError(f"job type must be a non-empty string of <= 200 chars: {type!r}")
        if not isinstance(args, dict):
            raise InvalidJobError(f"args must be a dict, got {args.__class__.__name__}")
        try:  # (not check_json: its message would be formatted on every call)
            args_json = _ENCODE(args)
        except (TypeError, ValueError) as exc:
            raise NotJSONError(f"args of {type!r} is not JSON-serializable: {exc}") from None
        # These options at their defaults (a bulk load, with or without a group) cannot be
        # wrong: skip their checks. What comes from the queue's and the handler's settings
        # (group, timeout, max_attempts) is checked either way, in the same order.
        plain = (weight.__class__ is int and weight == 1
                 and priority.__class__ is int and priority == 0
                 and key is None and run_after is None and parent is None
                 and depends_on.__class__ is tuple and not depends_on)
        group = self._q.default_group if group is None else group
        if not isinstance(group, str) or not group or len(group) > 200:
            raise InvalidJobError(f"group must be a non-empty string of <= 200 chars: {group!r}")
        if not plain:
            if not _is_int(weight) or not 1 <= weight <= MAX_INT:
                raise InvalidJobError(f"weight must be a (32-bit) int >= 1: {weight!r}")
            if not _is_int(priority) or not -MAX_INT <= priority <= MAX_INT:
                raise InvalidJobError(f"priority must be a (32-bit) int: {priority!r}")
        handler = self._q._handlers.get(type)
        if timeout is None and handler is not None:
            timeout = handler.timeout
        if timeout is not None and (
            not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0
        ):
            raise InvalidJobError(f"timeout must be a positive number of seconds: {timeout!r}")
        if max_attempts is None:
            max_attempts = (handler.max_attempts if handler is not None else None) or (
                self._q.max_attempts
            )
        if not _is_int(max_attempts) or not 1 <= max_attempts <= MAX_INT:
            raise InvalidJobError(f"max_attempts must be a (32-bit) int >= 1: {max_attempts!r}")
        when: timedelta | datetime | None = None
        deps: list[Ref] = []
        if not plain:
            if key is not None and (not isinstance(key, str) or not key or len(key) > 255):
                raise InvalidJobError(f"key must be a non-empty string of <= 255 chars: {key!r}")
            if isinstance(run_after, (int, float)) and not isinstance(run_after, bool):
                run_after = timedelta(seconds=run_after)
            if run_after is not None and not isinstance(run_after, (timedelta, datetime)):
                raise InvalidJobError(
                    f"run_after must be a timedelta, datetime or seconds: {run_after!r}"
                )
            when = run_after
            deps = list(depends_on)
            for d in deps:
                self._check_ref(d)
            if parent is not None:
                self._check_ref(parent)
                if isinstance(parent, JobRef) and not parent.is_container:
                    raise InvalidJobError(f"parent {parent!r} is not a container")
        ref = JobRef(self, len(self._specs), type, is_container)
        self._specs.append(
            _Spec(
                ref, type, args_json, group, int(weight), int(priority),
                None if timeout is None else float(timeout), int(max_attempts), key,
                when, deps, parent, is_container,
            )
        )
        return ref

    def _check_ref(self, r: Any) -> None:
        if isinstance(r, JobRef):
            if r._batch is not self:
                if r._id is None:
                    raise InvalidJobError(f"{r!r} belongs to another batch that was not inserted")
                return
            return
        if not _is_int(r) or r < 1:
            raise InvalidJobError(f"not a job id or batch ref: {r!r}")
        if r > MAX_ID:  # the database would reject it with a driver error
            raise UnknownJobError(f"unknown job id in depends_on/parent: {r}")

    # -- context manager --------------------------------------------------------------------
    async def __aenter__(self) -> Batch:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if et is None:
            await self.commit()

    async def commit(self) -> list[int]:
        """Insert everything added so far (called by ``async with`` on exit)."""
        if self._done:
            raise InvalidJobError("this batch has already been inserted")
        self._done = True
        if not self._specs:
            return []
        return await self._q._insert_batch(self._specs, self._conn)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


async def insert_specs(
    q: JobQueue, conn: AsyncConnection, specs: Sequence[_Spec]
) -> tuple[list[int], bool]:
    """Insert ``specs`` on ``conn`` (inside a transaction). Returns (ids, any_ready)."""
    J = q._t.jobs
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
    graph = any(s.depends_on or s.parent is not None for s in fresh)
    if graph:
        levels = await _plan_graph(q, conn, fresh, existing, ups)
    else:
        for s in fresh:
            s.state = (S.ACTIVE if s.is_container
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
        ids = None if q._force_insert_fallback else await q._ops.insert_jobs(conn, cols, wake)
        if ids is not None:
            wake = False  # sent by the bulk statement
        else:
            ids = await _insert_rows(q, conn, _rows(cols), wake)
            wake = wake and q._ops.notify_expr() is None
        for s, new_id in zip(level, ids, strict=True):
            s.ref._id = new_id
    if graph:
        edges = [(s.ref.id, resolve(d)) for s in fresh for d in s.dep_nodes]
        await q._ops.insert_edges(conn, [j for j, _ in edges], [u for _, u in edges])
    groups = sorted({s.group for s in fresh if not s.is_container})
    if groups:
        await q._ensure_groups(conn, groups)
    # containers that start active with no children are finished at once (roll-up).
    empty = [s.ref.id for s in fresh if s.is_container and s.state == S.ACTIVE]
    if empty:
        # finished at once: release what waits on them (and roll up their parents) too
        await q._completer.settle(conn, await q._completer.rollup(conn, empty))
    if wake:
        await q._ops.notify(conn)
    return [s.ref.id for s in specs], any_ready


async def insert_alone(q: JobQueue, specs: Sequence[_Spec]) -> tuple[list[int], bool] | None:
    """Plain jobs (JobQueue._lone_insert: no key, edge, parent or container, a known group)
    as one bulk statement of their own, in autocommit: one round trip and none of the
    planning above. Returns (ids, any_ready) like insert_specs, or None where the dialect
    has no such statement (then the caller runs a transaction)."""
    if q._force_insert_fallback:
        return None
    n = len(specs)
    for s in specs:
        s.state = S.SCHEDULED if s.run_after is not None else S.READY
    any_ready = any(s.state == S.READY for s in specs)
    cols = _columns(specs, [None] * n, [False] * n, [None] * n)
    ids = await q._ops.insert_jobs_alone(q.engine, cols, any_ready)
    if ids is None:
        return None
    for s, new_id in zip(specs, ids, strict=True):
        s.ref._id = new_id
    return ids, any_ready


async def _plan_graph(
    q: JobQueue,
    conn: AsyncConnection,
    fresh: Sequence[_Spec],
    existing: dict[int, Any],
    ups: set[Node],
) -> list[list[_Spec]]:
    """Lock and read the existing jobs the batch refers to (into ``existing``), reject
    cycles, set each fresh spec's state and pending counter, flag every upstream (into
    ``ups``) and return the fresh specs in insert levels (parents before children)."""
    J = q._t.jobs
    # Existing jobs that are referenced: lock them (a finalize updates them too, and must
    # either see our edges or finish before we read its state) and read them.
    ext_ids = sorted(
        {k for s in fresh for kind, k in [*s.dep_nodes, *([s.parent_node] if s.parent_node
                                                           else [])] if kind == "e"}
    )
    for i in range(0, len(ext_ids), CHUNK):
        stmt = q._ops.for_update(
            select(J.c.id, J.c.kind, J.c.state, J.c.parent_id, J.c.pending)
            .where(J.c.id.in_(ext_ids[i : i + CHUNK]))
            .order_by(J.c.id)
        )
        existing.update({row.id: row for row in (await conn.execute(stmt)).all()})
    missing = [i for i in ext_ids if i not in existing]
    if missing:
        raise UnknownJobError(f"unknown job id(s) in depends_on/parent: {missing[:10]}")
    for s in fresh:
        if s.parent_node is not None and s.parent_node[0] == "e":
            p = existing[s.parent_node[1]]
            if p.kind != S.CONTAINER:
                raise InvalidJobError(f"parent {p.id} is a job, not a container")
            if p.state in S.TERMINAL:
                raise ContainerClosedError(
                    f"container {p.id} has already finished ({p.state}); it takes no new children"
                )

    await _check_cycles(q, conn, fresh)

    # States and pending counters, parents and upstreams first.
    order = _parent_first(fresh)
    state: dict[Node, str] = {("e", i): r.state for i, r in existing.items()}
    cause: dict[Node, int] = {("e", i): i for i, r in existing.items()
                              if r.state in (S.FAILED, S.CANCELLED)}
    # Jobs whose pending holds their container's credit (S.CREDIT), and their parent.
    parent: dict[Node, Any] = {("e", i): ("e", r.parent_id) for i, r in existing.items()}
    credited = {("e", i) for i, r in existing.items()
                if r.state == S.WAITING and r.pending >= S.CREDIT}
    for s in order:
        n = s.node
        pending = 0
        for dn in s.dep_nodes:
            if state[dn] == S.DONE:
                continue
            pending += 1
            if dn in cause:
                cause.setdefault(n, cause[dn])
        pn = s.parent_node
        if pn is not None:
            parent[n] = pn
            if pn in cause:
                cause.setdefault(n, cause[pn])
            # No credit for a job that waits on a sibling holding one: that sibling cannot
            # run before the container is active, so neither can this job, and activating
            # the container then rewrites only the credited rows.
            if state[pn] != S.ACTIVE and not any(
                    d in credited and parent.get(d) == pn for d in s.dep_nodes):
                pending += S.CREDIT
                credited.add(n)
        s.pending = pending
        if n in cause:
            s.state, s.cancelled_by = S.CANCELLED, cause[n]
        elif pending:
            s.state = S.WAITING
        elif s.is_container:
            s.state = S.ACTIVE
        else:
            s.state = S.SCHEDULED if s.run_after is not None else S.READY
        state[n] = s.state

    # Insert level by level (a child's parent_id must be known).
    levels: dict[int, list[_Spec]] = defaultdict(list)
    depth: dict[int, int] = {}
    for s in order:
        up = s.parent_node
        depth[s.ref._index] = depth[up[1]] + 1 if up is not None and up[0] == "n" else 0
        levels[depth[s.ref._index]].append(s)

    # Flag every upstream (under the row locks taken above for existing ones): a finalize
    # that finds the flag unset knows no edge can be waiting on it (completer.finish_fast).
    ups.update(d for s in fresh for d in s.dep_nodes)
    live_ups = sorted(k for kind, k in ups if kind == "e" and existing[k].state not in S.TERMINAL)
    for i in range(0, len(live_ups), CHUNK):
        await conn.execute(update(J).where(J.c.id.in_(live_ups[i : i + CHUNK]))
                           .values(has_dependents=True))
    return [levels[d] for d in sorted(levels)]


def _columns(
    level: Sequence[_Spec], parents: list[int | None], flagged: list[bool],
    errors: list[str | None],
) -> JobColumns:
    """One insert level as columns (see DialectOps.insert_jobs): a list per field, not a
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
        "kind": [S.CONTAINER if s.is_container else S.JOB for s in level],
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
        })
    return out


def _insert_stmt(q: JobQueue, **values: Any) -> Any:
    """INSERT into jobs with args/error bound as the JSON text encoded at add() (no second
    encoding by the JSON type)."""
    as_json = q._ops.json_param
    return insert(q._t.jobs).values(
        args=as_json("args_json"), error=as_json("error_json"), **values
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
    q: JobQueue, conn: AsyncConnection, rows: list[dict[str, Any]]
) -> list[tuple[list[int], Any, list[dict[str, Any]]]]:
    """Split rows into statement shapes: (row indexes, INSERT, executemany params). The
    common rows take their times from the database clock inside the INSERT; the rare ones
    (absolute run_after, born cancelled) a clock read once."""
    common = [i for i, r in enumerate(rows) if r["_delay"] is not None and not r["_dead"]]
    rare = [i for i, r in enumerate(rows) if r["_delay"] is None or r["_dead"]]
    out: list[tuple[list[int], Any, list[dict[str, Any]]]] = []
    if common:
        stmt = q._stmts.get("insert_common")
        if stmt is None:
            stmt = q._stmts["insert_common"] = _insert_stmt(
                q, created_at=db_now(), finished_at=None, run_after=utcnow_plus(bindparam("_delay"))
            )
        out.append((common, stmt, [{k: v for k, v in rows[i].items()
                                    if k not in ("_dead", "run_after")} for i in common]))
    if rare:
        now = (await conn.execute(select(db_now()))).scalar_one()
        out.append((rare, _insert_stmt(q), [_with_times(rows[i], now) for i in rare]))
    return out


async def _insert_rows(
    q: JobQueue, conn: AsyncConnection, rows: list[dict[str, Any]], wake: bool = False
) -> list[int]:
    """Insert job rows (from insert_specs) and return their ids in order. ``wake``: also send
    the dialect's wake-up from this statement when it can (see DialectOps.notify_expr)."""
    J = q._t.jobs
    dialect = conn.dialect
    ordered = dialect.insert_executemany_returning_sort_by_parameter_order and bool(
        dialect.insertmanyvalues_implicit_sentinel & InsertmanyvaluesSentinelOpts.ANY_AUTOINCREMENT
    )
    notify = q._ops.notify_expr() if wake else None
    extra = [notify] if notify is not None else []
    ids: dict[int, int] = {}
    for idx, stmt, params in await _shapes(q, conn, rows):
        if dialect.insert_returning and ordered and not q._force_insert_fallback:
            for c in range(0, len(idx), CHUNK * 5):
                res = await conn.execute(
                    stmt.returning(J.c.id, *extra, sort_by_parameter_order=True),
                    params[c : c + CHUNK * 5],
                )
                ids.update(zip(idx[c : c + CHUNK * 5], (r[0] for r in res.all()), strict=True))
                extra = []
        elif dialect.insert_returning and not q._force_insert_fallback:
            # SQLite: without an implicit sentinel SQLAlchemy would send ordered RETURNING one
            # row per statement. Unordered, it sends multi-row INSERTs in order; under the
            # write lock each numbers its rows upwards in VALUES order, so the sorted ids are
            # the rows' ids.
            for c in range(0, len(idx), CHUNK * 5):
                chunk = params[c : c + CHUNK * 5]
                res = await conn.execute(stmt.returning(J.c.id, *extra), chunk)
                got = sorted(r[0] for r in res.all())
                if len(got) != len(chunk):  # pragma: no cover - defensive
                    raise RuntimeError("multi-row INSERT returned the wrong number of ids")
                ids.update(zip(idx[c : c + CHUNK * 5], got, strict=True))
                extra = []
        else:
            # MySQL 8 has no INSERT ... RETURNING, and with innodb_autoinc_lock_mode=2 a
            # multi-row INSERT's ids are increasing but not guaranteed consecutive. So tag the
            # rows with a token in the (still unused) lease_owner column, read the ids back
            # in id order, and clear the tag.
            token = f"insert:{uuid.uuid4().hex}"
            for c in range(0, len(idx), CHUNK):
                chunk = [dict(r, lease_owner=token) for r in params[c : c + CHUNK]]
                await conn.execute(stmt, chunk)  # executemany: batched multi-row INSERTs
                got = [r[0] for r in await conn.execute(
                    select(J.c.id)
                    .where(J.c.state.in_(S.LIVE + S.TERMINAL), J.c.lease_owner == token)
                    .order_by(J.c.id)
                )]
                if len(got) != len(chunk):  # pragma: no cover - would mean a broken id mapping
                    raise RuntimeError(f"inserted {len(chunk)} jobs but found {len(got)}")
                await conn.execute(update(J).where(J.c.id.in_(got)).values(lease_owner=None))
                ids.update(zip(idx[c : c + CHUNK], got, strict=True))
    return [ids[i] for i in range(len(rows))]


def _parent_first(specs: Sequence[_Spec]) -> list[_Spec]:
    """Order fresh specs so every parent and every fresh dependency comes first."""
    idx = {s.ref._index: s for s in specs}
    indeg: dict[int, int] = {i: 0 for i in idx}
    out_edges: dict[int, list[int]] = defaultdict(list)
    for s in specs:
        ups = [*s.dep_nodes, *([s.parent_node] if s.parent_node is not None else [])]
        for kind, key in ups:
            if kind == "n" and key in idx:
                out_edges[key].append(s.ref._index)
                indeg[s.ref._index] += 1
    ready = deque(sorted(i for i, d in indeg.items() if d == 0))
    order: list[_Spec] = []
    while ready:
        i = ready.popleft()
        order.append(idx[i])
        for j in out_edges[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                ready.append(j)
    if len(order) != len(specs):
        raise DependencyCycleError("the batch's dependencies form a cycle")
    return order


async def _check_cycles(q: JobQueue, conn: AsyncConnection, fresh: Sequence[_Spec]) -> None:
    """Reject a DAG that would wait on itself, counting container membership.

    The wait graph has an edge u -> v when u cannot finish before v does: u depends on v;
    u is a container and v its child; a child waits for its container's gate, and a gate
    waits for that container's dependencies and for its own container's gate. Existing jobs
    never gain edges to new ones except through new children of existing containers, so
    the database is walked only when the batch adds children to an existing container.
    """
    adj: dict[Any, set[Any]] = defaultdict(set)
    for s in fresh:
        n = s.node
        for d in s.dep_nodes:
            adj[n].add(d)
            adj[("g", n)].add(d)
        p = s.parent_node
        if p is not None:
            adj[p].add(n)
            adj[n].add(("g", p))
            adj[("g", n)].add(("g", p))
    if any(s.parent_node is not None and s.parent_node[0] == "e" for s in fresh):
        await _load_existing_graph(q, conn, adj)
    _assert_acyclic(adj)


def _existing_ids(adj: dict[Any, set[Any]]) -> set[int]:
    out: set[int] = set()
    for n in [*adj, *(v for vs in adj.values() for v in vs)]:
        base = n[1] if n[0] == "g" else n
        if base[0] == "e":
            out.add(base[1])
    return out


async def _load_existing_graph(
    q: JobQueue, conn: AsyncConnection, adj: dict[Any, set[Any]]
) -> None:
    """Pull the live part of the wait graph reachable from the batch out of the database."""
    J, D = q._t.jobs, q._t.deps
    live = list(S.LIVE)
    seen: set[int] = set()
    frontier = _existing_ids(adj)
    while frontier:
        batch = sorted(frontier - seen)
        seen |= set(batch)
        nxt: set[int] = set()
        for i in range(0, len(batch), CHUNK):
            part = batch[i : i + CHUNK]
            rows = (await conn.execute(
                select(J.c.id, J.c.parent_id).where(J.c.id.in_(part), J.c.state.in_(live))
            )).all()
            part = [r.id for r in rows]  # finished jobs wait for nothing
            for r in rows:
                if r.parent_id is not None:
                    p = ("e", r.parent_id)
                    adj[("e", r.id)].add(("g", p))
                    adj[("g", ("e", r.id))].add(("g", p))
                    nxt.add(r.parent_id)
            for r in (await conn.execute(
                select(D.c.job_id, D.c.depends_on_id).where(D.c.job_id.in_(part))
            )).all():
                adj[("e", r.job_id)].add(("e", r.depends_on_id))
                adj[("g", ("e", r.job_id))].add(("e", r.depends_on_id))
                nxt.add(r.depends_on_id)
            for r in (await conn.execute(
                select(J.c.id, J.c.parent_id).where(J.c.parent_id.in_(part), J.c.state.in_(live))
            )).all():
                adj[("e", r.parent_id)].add(("e", r.id))
                nxt.add(r.id)
        frontier = nxt - seen


def _assert_acyclic(adj: dict[Any, set[Any]]) -> None:
    indeg: dict[Any, int] = defaultdict(int)
    nodes = set(adj)
    for vs in adj.values():
        for v in vs:
            indeg[v] += 1
            nodes.add(v)
    queue = deque(n for n in nodes if indeg[n] == 0)
    seen = 0
    while queue:
        u = queue.popleft()
        seen += 1
        for v in adj.get(u, ()):
            indeg[v] -= 1
            if indeg[v] == 0:
                queue.append(v)
    if seen != len(nodes):
        raise DependencyCycleError(
            "these dependencies would form a cycle (a container waits for its children, so a "
            "child must not depend on anything that waits for its container)"
        )


async def with_retry_on_key_race(coro_factory: Any) -> Any:
    """Run ``coro_factory()``; a concurrent insert of the same key retries once."""
    try:
        return await coro_factory()
    except IntegrityError:
        return await coro_factory()

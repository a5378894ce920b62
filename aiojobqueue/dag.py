"""DAG planning: lock and read the existing jobs a batch refers to, reject cycles (container
membership included), set each new job's state and pending count (and the group and weight
a child inherits from its container), flag every upstream, and order the new jobs in insert
levels (parents before children)."""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .batch import Node, UnknownJobError, _Spec
from .database import Database
from .errors import ContainerClosedError, DependencyCycleError, InvalidJobError
from .sql import chunks


async def plan_graph(
    db: Database,
    conn: AsyncConnection,
    fresh: Sequence[_Spec],
    existing: dict[int, Any],
    ups: set[Node],
) -> list[list[_Spec]]:
    """Lock and read the existing jobs the batch refers to (into ``existing``), reject
    cycles, set each fresh spec's state and pending counter, flag every upstream (into
    ``ups``) and return the fresh specs in insert levels (parents before children)."""
    await _lock_existing(db, conn, fresh, existing)
    _check_parents(fresh, existing)
    await _check_cycles(db, conn, fresh)

    # States and pending counters, parents and upstreams first.
    order = _parent_first(fresh)
    states = _States(existing)
    for s in order:
        states.place(s)

    levels = _levels(order)
    await _flag_upstreams(db, conn, fresh, existing, ups)
    return levels


async def _lock_existing(
    db: Database, conn: AsyncConnection, fresh: Sequence[_Spec], existing: dict[int, Any]
) -> None:
    """Lock and read (into ``existing``) the existing jobs the batch refers to; refuse an id
    that names no job."""
    J = db.t.jobs
    # Existing jobs that are referenced: lock them (a finalize updates them too, and must
    # either see our edges or finish before we read its state) and read them.
    ext_ids = sorted(
        {k for s in fresh for kind, k in [*s.dep_nodes, *([s.parent_node] if s.parent_node
                                                           else [])] if kind == "e"}
    )
    for part in chunks(ext_ids):
        stmt = db.ops.for_update(
            select(J.c.id, J.c.kind, J.c.state, J.c.parent_id, J.c.pending, J.c.group_key,
                   J.c.weight)
            .where(J.c.id.in_(part))
            .order_by(J.c.id)
        )
        existing.update({row.id: row for row in (await conn.execute(stmt)).all()})
    missing = [i for i in ext_ids if i not in existing]
    if missing:
        raise UnknownJobError(f"unknown job id(s) in depends_on/parent: {missing[:10]}")


def _check_parents(fresh: Sequence[_Spec], existing: dict[int, Any]) -> None:
    """Refuse an existing parent that is a job, or a container that has already finished."""
    for s in fresh:
        if s.parent_node is not None and s.parent_node[0] == "e":
            p = existing[s.parent_node[1]]
            if p.kind != S.CONTAINER:
                raise InvalidJobError(f"parent {p.id} is a job, not a container")
            if p.state in S.TERMINAL:
                raise ContainerClosedError(
                    f"container {p.id} has already finished ({p.state}); it takes no new children"
                )


class _States:
    """What plan_graph knows of every node while it sets the fresh specs' states (in parent
    first order): each node's state, the failed or cancelled job that cancels it, its
    container, which jobs hold their container's credit, and each node's group and weight."""

    def __init__(self, existing: dict[int, Any]) -> None:
        self.state: dict[Node, str] = {("e", i): r.state for i, r in existing.items()}
        self.cause: dict[Node, int] = {("e", i): i for i, r in existing.items()
                                       if r.state in (S.FAILED, S.CANCELLED)}
        # Jobs whose pending holds their container's credit (S.CREDIT), and their parent.
        self.parent: dict[Node, Any] = {
            ("e", i): ("e", r.parent_id) for i, r in existing.items()}
        self.credited = {("e", i) for i, r in existing.items()
                         if r.state == S.WAITING and r.pending >= S.CREDIT}
        # (group, weight) by node: a child given neither takes its container's
        self.traits: dict[Node, tuple[str, int]] = {
            ("e", i): (r.group_key, r.weight) for i, r in existing.items()}

    def place(self, s: _Spec) -> None:
        """Set ``s``'s group and weight (inherited), pending counter and state; its
        upstreams and container have been placed already."""
        n = s.node
        if s.parent_node is not None and (s.group_from_parent or s.weight_from_parent):
            group, weight = self.traits[s.parent_node]
            if s.group_from_parent:
                s.group = group
            if s.weight_from_parent:
                s.weight = weight
        self.traits[n] = (s.group, s.weight)
        pending = self._upstream_pending(s) + self._container_credit(s)
        s.pending = pending
        if n in self.cause:
            s.state, s.cancelled_by = S.CANCELLED, self.cause[n]
        elif pending:
            s.state = S.WAITING
        elif s.is_container:
            s.state = S.ACTIVE
        elif s.is_external:
            s.state = S.EXTERNAL
        else:
            s.state = S.SCHEDULED if s.run_after is not None else S.READY
        self.state[n] = s.state

    def _upstream_pending(self, s: _Spec) -> int:
        """The part of ``s``'s pending counter its dependencies make (a run condition's
        hold included); notes an upstream's cause as ``s``'s."""
        n = s.node
        pending = 0
        failed_up = False
        for dn in s.dep_nodes:
            if self.state[dn] == S.DONE:
                continue
            if s.when != "done" and self.state[dn] in (S.FAILED, S.CANCELLED):
                failed_up = True  # ended: what a run condition waits for (conditions.py)
                continue
            pending += 1
            if dn in self.cause:
                self.cause.setdefault(n, self.cause[dn])
        if s.when == "failed" and not failed_up:
            if not pending:
                raise InvalidJobError(
                    f"when='failed': every dependency of {s.type!r} is already done (or it has "
                    "none), so it could never run")
            pending += S.HOLD
        return pending

    def _container_credit(self, s: _Spec) -> int:
        """The credit ``s`` holds for a container that is not active yet (0 or S.CREDIT);
        notes its container's cause as ``s``'s."""
        n = s.node
        pn = s.parent_node
        if pn is None:
            return 0
        self.parent[n] = pn
        if pn in self.cause:
            self.cause.setdefault(n, self.cause[pn])
        # No credit for a job that waits on a sibling holding one: that sibling cannot
        # run before the container is active, so neither can this job, and activating
        # the container then rewrites only the credited rows.
        if self.state[pn] != S.ACTIVE and not any(
                d in self.credited and self.parent.get(d) == pn for d in s.dep_nodes):
            self.credited.add(n)
            return S.CREDIT
        return 0


def _levels(order: Sequence[_Spec]) -> list[list[_Spec]]:
    """The specs (parent first order) in insert levels: a child's parent_id must be known."""
    levels: dict[int, list[_Spec]] = defaultdict(list)
    depth: dict[int, int] = {}
    for s in order:
        up = s.parent_node
        depth[s.ref._index] = depth[up[1]] + 1 if up is not None and up[0] == "n" else 0
        levels[depth[s.ref._index]].append(s)
    return [levels[d] for d in sorted(levels)]


async def _flag_upstreams(
    db: Database, conn: AsyncConnection, fresh: Sequence[_Spec], existing: dict[int, Any],
    ups: set[Node],
) -> None:
    """Note every upstream in ``ups`` and set has_dependents on the live existing ones."""
    J = db.t.jobs
    # Flag every upstream (under the row locks taken above for existing ones): a finalize
    # that finds the flag unset knows no edge can be waiting on it (finalize.finish_fast).
    ups.update(d for s in fresh for d in s.dep_nodes)
    live_ups = sorted(k for kind, k in ups if kind == "e" and existing[k].state not in S.TERMINAL)
    for part in chunks(live_ups):
        await conn.execute(update(J).where(J.c.id.in_(part))
                           .values(has_dependents=True))


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


async def _check_cycles(db: Database, conn: AsyncConnection, fresh: Sequence[_Spec]) -> None:
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
        await _load_existing_graph(db, conn, adj)
    _assert_acyclic(adj)


def _existing_ids(adj: dict[Any, set[Any]]) -> set[int]:
    out: set[int] = set()
    for n in [*adj, *(v for vs in adj.values() for v in vs)]:
        base = n[1] if n[0] == "g" else n
        if base[0] == "e":
            out.add(base[1])
    return out


async def _load_existing_graph(
    db: Database, conn: AsyncConnection, adj: dict[Any, set[Any]]
) -> None:
    """Pull the live part of the wait graph reachable from the batch out of the database."""
    J, D = db.t.jobs, db.t.deps
    live = list(S.LIVE)
    seen: set[int] = set()
    frontier = _existing_ids(adj)
    while frontier:
        batch = sorted(frontier - seen)
        seen |= set(batch)
        nxt: set[int] = set()
        for part in chunks(batch):
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

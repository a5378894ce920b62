"""The DAG page's reads: a job's outermost container with its content, its upstream and
downstream closures, bounded by ``DAG_FETCH`` nodes (the layout is ``dag.py``'s)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import func, literal, select
from sqlalchemy.ext.asyncio import AsyncConnection

from .. import schema as S
from ..errors import JobNotFoundError
from . import views as V
from .reader import Reader
from .views import DAG_FETCH, STATES, Graph, Node, lit


class DagReads(Reader):
    """The DAG page's reads (a part of ``data.Data``)."""

    async def dag(self, job_id: int, children: int | None = None) -> Graph:
        """The DAG around a job: the whole content of its outermost container (or of the job
        if it is one), its upstream and downstream closures, and the containers of every node
        fetched. Bounded by DAG_FETCH nodes and ``children`` per container (the page drawing
        everything asks for DAG_FETCH)."""
        children = V.DAG_CHILDREN if children is None else children

        async def read(conn: AsyncConnection) -> Graph:
            g = _GraphRead(self.t, conn, children)
            root = await g.outermost(job_id)
            await g.expand([root.id] if root.kind == S.CONTAINER else [])
            # The focus job's closures over dependency edges (recursive CTEs, bounded).
            truncated = False
            for ids in (await self._closure(conn, job_id, up=True),
                        await self._closure(conn, job_id, up=False)):
                if len(ids) >= DAG_FETCH:
                    truncated = True
                await g.fetch(ids[: max(DAG_FETCH - len(g.nodes), 0)])
            # ... and the content of the containers among them
            await g.expand(sorted(n.id for n in g.nodes.values() if n.kind == S.CONTAINER))
            await g.containers()
            hidden = await self._hidden_of(conn, g.over, g.nodes)
            edges = await g.edges()
            await external_notes(self.t, conn, g.nodes)
            return Graph(job_id, g.nodes, edges, hidden,
                         truncated or len(g.nodes) >= DAG_FETCH)

        return await self._read(read)

    async def _hidden_of(self, conn: AsyncConnection, over: set[int],
                         nodes: dict[int, Node]) -> dict[int, dict[str, int]]:
        """The children not fetched of each container in ``over``, counted by state: last,
        as the closures may have fetched some of those its expansion left out."""
        out = {}
        for cid in sorted(over):
            shown = [n.id for n in nodes.values() if n.parent_id == cid]
            counts = await self._hidden(conn, cid, shown)
            if counts:
                out[cid] = counts
        return out

    async def _hidden(self, conn: AsyncConnection, cid: int, shown: list[int]) -> dict[str, int]:
        """State counts of a container's children not drawn (capped per state)."""
        J = self.t.jobs
        out: dict[str, int] = {}
        for s in STATES:
            n = await conn.scalar(select(func.count()).select_from(
                select(literal(1).label("x"))
                .where(J.c.parent_id == cid, J.c.state == lit(s), J.c.id.not_in(shown))
                .limit(V.CAP + 1).subquery()))
            if n:
                out[s] = int(n)
        return out

    async def _closure(self, conn: AsyncConnection, job_id: int, up: bool) -> list[int]:
        """Ids reachable from ``job_id`` over dependency edges (upstream or downstream),
        DAG_FETCH at most."""
        D = self.t.deps
        src, dst = (D.c.job_id, D.c.depends_on_id) if up else (D.c.depends_on_id, D.c.job_id)
        seed = select(dst.label("id")).where(src == job_id).cte("reach", recursive=True)
        step = select(dst.label("id")).join(seed, src == seed.c.id)
        reach = seed.union(step)
        rows = await conn.execute(select(reach.c.id).limit(DAG_FETCH))
        return [r[0] for r in rows]


class _GraphRead:
    """One read of the DAG page: the nodes fetched so far, and the containers expanded."""

    def __init__(self, t: S.Tables, conn: AsyncConnection, children: int) -> None:
        self.t, self.conn, self.children = t, conn, children
        J = t.jobs
        self.cols = (J.c.id, J.c.type, J.c.kind, J.c.state, J.c.parent_id, J.c.group_key)
        self.nodes: dict[int, Node] = {}
        self.over: set[int] = set()  # containers with more children than expand fetched
        self.expanded: set[int] = set()

    async def fetch(self, ids: Iterable[int]) -> list[Node]:
        """The nodes of ``ids`` not fetched yet (added to ``nodes``)."""
        J = self.t.jobs
        want = sorted(set(ids) - self.nodes.keys())
        got: list[Node] = []
        for i in range(0, len(want), 500):
            part = want[i : i + 500]
            for r in await self.conn.execute(select(*self.cols).where(J.c.id.in_(part))):
                n = Node(r.id, r.type, r.kind, r.state, r.parent_id, r.group_key)
                self.nodes[n.id] = n
                got.append(n)
        return got

    async def outermost(self, job_id: int) -> Node:
        """The job's outermost container (the job if it has none), fetched with the
        containers between. Raises JobNotFoundError."""
        first = await self.fetch([job_id])
        if not first:
            raise JobNotFoundError(f"no job with id {job_id}")
        root = first[0]
        while root.parent_id is not None and len(self.nodes) < 64:
            got = await self.fetch([root.parent_id])
            if not got:
                break
            root = got[0]
        return root

    async def expand(self, level: list[int]) -> None:
        """Containers' content, level by level, a bounded slice per container."""
        J, nodes, children = self.t.jobs, self.nodes, self.children
        while level and len(nodes) < DAG_FETCH:
            nxt: list[int] = []
            for cid in level:
                if cid in self.expanded:
                    continue
                self.expanded.add(cid)
                kids = (await self.conn.execute(
                    select(*self.cols).where(J.c.parent_id == cid).order_by(J.c.id)
                    .limit(children + 1))).all()
                for r in kids[:children]:
                    if r.id not in nodes:
                        nodes[r.id] = Node(r.id, r.type, r.kind, r.state, r.parent_id,
                                           r.group_key)
                    if r.kind == S.CONTAINER:
                        nxt.append(r.id)
                if len(kids) > children:
                    self.over.add(cid)
            level = nxt

    async def containers(self) -> None:
        """The containers of everything fetched, so each node is drawn inside its box."""
        missing = {n.parent_id for n in self.nodes.values()} - self.nodes.keys() - {None}
        rounds = 0
        while missing and rounds < 16:
            got = await self.fetch(m for m in missing if m is not None)
            missing = {n.parent_id for n in got} - self.nodes.keys() - {None}
            rounds += 1

    async def edges(self) -> list[tuple[int, int]]:
        """The dependency edges between the nodes fetched."""
        D, nodes = self.t.deps, self.nodes
        ids = sorted(nodes)
        edges: list[tuple[int, int]] = []
        for i in range(0, len(ids), 500):
            part = ids[i : i + 500]
            for up, down in await self.conn.execute(
                    select(D.c.depends_on_id, D.c.job_id).where(D.c.job_id.in_(part))):
                if up in nodes:
                    edges.append((up, down))
        return edges


def group_states(nodes: Iterable[Node]) -> dict[str, int]:
    """How many nodes are in each state."""
    out: dict[str, int] = defaultdict(int)
    for n in nodes:
        out[n.state] += 1
    return dict(out)


async def external_notes(t: S.Tables, conn: AsyncConnection, nodes: dict[int, Node]) -> None:
    """Each external step's note: who it waits for, since when, until when (its row's
    ``started_at`` and deadline ``lease_expires``: external.py)."""
    J = t.jobs
    ext = sorted(i for i, n in nodes.items() if n.kind == S.EXTERNAL_KIND)
    for i in range(0, len(ext), 500):
        for r in await conn.execute(select(J.c.id, J.c.state, J.c.started_at, J.c.lease_expires)
                                    .where(J.c.id.in_(ext[i : i + 500]))):
            nodes[r.id].note = external_note(r.state, r.started_at, r.lease_expires)


def external_note(state: str, since: datetime | None, until: datetime | None) -> str:
    """The tooltip of an external step."""
    if state == S.WAITING:
        return "external step: waits for its dependencies, then for complete() or fail()"
    if state != S.EXTERNAL:
        return "external step"
    at = f" since {since:%Y-%m-%d %H:%M:%S} UTC" if since else ""
    end = f", fails at {until:%Y-%m-%d %H:%M:%S} UTC" if until else ", no timeout"
    return f"external step: waiting for complete() or fail(){at}{end}"

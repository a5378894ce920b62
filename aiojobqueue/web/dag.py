"""The DAG page's drawing: a layered layout with containers as boxes, rendered as SVG.

No maintained Python layout library draws compound graphs (nodes inside boxes), so this is a
small one of our own, applied recursively: each container's children are laid out as a graph
of their own, and the container becomes one box of that size in its parent's layout. Within
one level: longest-path layering over the dependency edges lifted to that level (flowing left
to right), barycentre ordering to shorten edges, and long layers wrapped into several columns
so a fan-out of hundreds stays readable.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from markupsafe import Markup, escape

from .. import schema as S
from .data import DAG_DRAW, Graph, Node

NODE_W, NODE_H = 150, 30
H_GAP, V_GAP = 40, 10
PAD, HEAD = 12, 22
#: Nodes per column at least before a layer wraps into another column.
COLUMN = 14
WRAP_GAP = 14
SUMMARY = -1  # summary boxes get negative ids: -(container id)


@dataclass
class Box:
    """A placed node or container (absolute coordinates)."""

    id: int
    x: float
    y: float
    w: float
    h: float


@dataclass
class Layout:
    """Positions of everything drawn, and what the blocking path highlights."""

    boxes: dict[int, Box]
    width: float
    height: float
    edges: list[tuple[int, int]]
    blocking_nodes: set[int] = field(default_factory=set)
    blocking_edges: set[tuple[int, int]] = field(default_factory=set)
    not_drawn: int = 0


def nearest(graph: Graph, limit: int = DAG_DRAW) -> set[int]:
    """The ``limit`` nodes closest to the focus (over edges and container membership), with
    the containers of each so every node is drawn in its box."""
    adj: dict[int, list[int]] = defaultdict(list)
    for u, v in graph.edges:
        adj[u].append(v)
        adj[v].append(u)
    for node in graph.nodes.values():
        if node.parent_id is not None and node.parent_id in graph.nodes:
            adj[node.id].append(node.parent_id)
            adj[node.parent_id].append(node.id)
    keep: set[int] = set()
    seen = {graph.focus}
    todo = deque([graph.focus])
    while todo and len(keep) < limit:
        n = todo.popleft()
        keep.add(n)
        for m in sorted(adj[n]):
            if m not in seen:
                seen.add(m)
                todo.append(m)
    for n in sorted(graph.nodes):  # what no edge reaches (fetched all the same)
        if len(keep) >= limit:
            break
        keep.add(n)
    for n in list(keep):  # ancestors, so boxes enclose what they contain
        p = graph.nodes[n].parent_id
        while p is not None and p in graph.nodes and p not in keep:
            keep.add(p)
            p = graph.nodes[p].parent_id
    return keep


def blocking(graph: Graph, drawn: set[int]) -> tuple[set[int], set[tuple[int, int]]]:
    """What keeps a waiting focus job from running: its unfinished dependencies and those of
    its containers, transitively, down into unfinished containers' unfinished children."""
    nodes = graph.nodes
    focus = nodes[graph.focus]
    if focus.state in S.TERMINAL or focus.state in (S.RUNNING, S.READY):
        return set(), set()
    ups: dict[int, list[int]] = defaultdict(list)
    for u, v in graph.edges:
        ups[v].append(u)
    kids: dict[int, list[int]] = defaultdict(list)
    for node in nodes.values():
        if node.parent_id is not None:
            kids[node.parent_id].append(node.id)
    chain: set[int] = set()
    edges: set[tuple[int, int]] = set()
    todo = [graph.focus]
    p = focus.parent_id
    while p is not None and p in nodes:  # a job also waits on its containers' dependencies
        todo.append(p)
        p = nodes[p].parent_id
    seen: set[int] = set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        for u in ups[n]:
            if nodes[u].state != S.DONE:
                chain.add(u)
                edges.add((u, n))
                todo.append(u)
        if n != graph.focus and nodes[n].kind == S.CONTAINER and n in chain:
            for k in kids[n]:
                if nodes[k].state not in S.TERMINAL:
                    chain.add(k)
                    todo.append(k)
    return chain & drawn, {e for e in edges if e[0] in drawn and e[1] in drawn}


def layout(graph: Graph) -> Layout:
    """Lay out ``graph`` (at most DAG_DRAW nodes drawn, the nearest to the focus)."""
    drawn = nearest(graph)
    nodes = {i: graph.nodes[i] for i in drawn}
    kids: dict[int | None, list[int]] = defaultdict(list)
    for n in sorted(nodes.values(), key=lambda n: n.id):
        kids[n.parent_id if n.parent_id in nodes else None].append(n.id)
    for cid in graph.hidden_children:
        if cid in nodes:
            kids[cid].append(SUMMARY * cid)
    edges = [(u, v) for u, v in graph.edges if u in drawn and v in drawn]
    parent = {n.id: (n.parent_id if n.parent_id in nodes else None) for n in nodes.values()}
    for cid in graph.hidden_children:
        parent[SUMMARY * cid] = cid

    rel: dict[int, tuple[float, float, float, float]] = {}

    def place(members: list[int]) -> tuple[float, float]:
        """Place ``members`` (one level) relative to their block; returns the block size."""
        size: dict[int, tuple[float, float]] = {}
        for m in members:
            if m > 0 and nodes[m].kind == S.CONTAINER:
                w, h = place(kids[m]) if kids[m] else (NODE_W, 0.0)
                size[m] = (max(w + 2 * PAD, NODE_W), h + HEAD + PAD)
            else:
                size[m] = (NODE_W, NODE_H)
        here = set(members)

        def lift(n: int) -> int | None:
            while n not in here:
                p = parent.get(n)
                if p is None:
                    return None
                n = p
            return n

        succ: dict[int, set[int]] = defaultdict(set)
        pred: dict[int, set[int]] = defaultdict(set)
        for u, v in edges:
            a, b = lift(u), lift(v)
            if a is not None and b is not None and a != b:
                succ[a].add(b)
                pred[b].add(a)
        layer = _layers(members, succ, pred)
        columns = _order(members, layer, pred, succ)
        x = 0.0
        height = 0.0
        col_dims = []
        for col, cont in columns:
            if cont:  # the next column of one wrapped layer sits closer
                x -= H_GAP - WRAP_GAP
            cw = max(size[m][0] for m in col)
            ch = sum(size[m][1] for m in col) + V_GAP * (len(col) - 1)
            col_dims.append((x, cw, ch))
            height = max(height, ch)
            x += cw + H_GAP
        for (col, _cont), (cx, _cw, ch) in zip(columns, col_dims, strict=True):
            y = (height - ch) / 2
            for m in col:
                w, h = size[m]
                rel[m] = (cx, y, w, h)
                y += h + V_GAP
        return max(x - H_GAP, 0.0), height

    width, height = place(kids[None])
    boxes: dict[int, Box] = {}

    def absolute(members: Iterable[int], ox: float, oy: float) -> None:
        for m in members:
            x, y, w, h = rel[m]
            boxes[m] = Box(m, ox + x, oy + y, w, h)
            if m > 0 and nodes[m].kind == S.CONTAINER:
                absolute(kids[m], ox + x + PAD, oy + y + HEAD)

    absolute(kids[None], PAD, PAD)
    chain, chain_edges = blocking(graph, drawn)
    return Layout(boxes, width + 2 * PAD, height + 2 * PAD, edges, chain, chain_edges,
                  len(graph.nodes) - len(drawn))


def _layers(members: list[int], succ: dict[int, set[int]],
            pred: dict[int, set[int]]) -> dict[int, int]:
    """Longest-path layering. Lifting edges to one level can close a cycle the queue allows
    (a job depends on one child of a box, another child on it): the edges that close one
    are dropped here (drawn against the flow) so the rest stay left to right."""
    succ = {m: set(succ.get(m, ())) for m in members}
    state: dict[int, int] = {}
    for root in members:  # iterative DFS: drop back edges
        if root in state:
            continue
        state[root] = 1
        stack = [(root, iter(sorted(succ[root])))]
        while stack:
            m, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[m] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                succ[m].discard(nxt)
            elif nxt not in state:
                state[nxt] = 1
                stack.append((nxt, iter(sorted(succ[nxt]))))
    indeg = dict.fromkeys(members, 0)
    for m in members:
        for t in succ[m]:
            indeg[t] += 1
    layer = dict.fromkeys(members, 0)
    todo = deque(m for m in members if indeg[m] == 0)
    while todo:
        m = todo.popleft()
        for t in sorted(succ[m]):
            layer[t] = max(layer[t], layer[m] + 1)
            indeg[t] -= 1
            if indeg[t] == 0:
                todo.append(t)
    return layer


def _order(members: list[int], layer: dict[int, int], pred: dict[int, set[int]],
           succ: dict[int, set[int]]) -> list[tuple[list[int], bool]]:
    """Order each layer by the barycentre of its neighbours (a few sweeps each way), then
    wrap long layers into columns; each column comes with whether it continues a layer."""
    n_layers = max(layer.values(), default=0) + 1
    layers: list[list[int]] = [[] for _ in range(n_layers)]
    for m in sorted(members):
        layers[layer[m]].append(m)
    pos = {m: float(i) for lay in layers for i, m in enumerate(lay)}
    for sweep in range(4):
        rng = range(1, n_layers) if sweep % 2 == 0 else range(n_layers - 2, -1, -1)
        for i in rng:
            near = pred if sweep % 2 == 0 else succ

            def bary(m: int, near: dict[int, set[int]] = near) -> float:
                ns = [pos[n] for n in near[m] if n in pos]
                return sum(ns) / len(ns) if ns else pos[m]

            layers[i].sort(key=lambda m: (bary(m), m))
            for k, m in enumerate(layers[i]):
                pos[m] = float(k)
    columns: list[tuple[list[int], bool]] = []
    for lay in layers:
        # a wide layer becomes a roughly square block of columns (no edges run between them)
        per = max(COLUMN, math.ceil(math.sqrt(len(lay) * (NODE_W + WRAP_GAP) / (NODE_H + V_GAP))))
        for k in range(0, len(lay), per):
            columns.append((lay[k : k + per], k > 0))
    return [c for c in columns if c[0]]


# -- SVG ------------------------------------------------------------------------------------
def svg(graph: Graph, lay: Layout, job_url: str) -> Markup:
    """The layout as an inline SVG; ``job_url`` has ``{id}`` where a job id goes."""
    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="dag" width="{lay.width:.0f}" '
        f'height="{lay.height:.0f}" viewBox="0 0 {lay.width:.0f} {lay.height:.0f}" '
        'role="img" aria-label="job DAG">',
        # arrow heads in user units: the same size on thin and highlighted edges
        '<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="8" '
        'markerHeight="8" markerUnits="userSpaceOnUse" orient="auto-start-reverse">'
        '<path d="M0,0 L8,4 L0,8 z"/></marker>'
        '<marker id="arrow-hot" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="9" '
        'markerHeight="9" markerUnits="userSpaceOnUse" orient="auto-start-reverse">'
        '<path d="M0,0 L8,4 L0,8 z"/></marker></defs>',
    ]
    containers = sorted((b for b in lay.boxes.values()
                         if b.id > 0 and graph.nodes[b.id].kind == S.CONTAINER),
                        key=lambda b: (b.w * b.h), reverse=True)
    for b in containers:
        n = graph.nodes[b.id]
        cls = _cls(n, graph.focus, lay)
        out.append(
            f'<g class="container {cls}" data-id="{n.id}" data-state="{n.state}">'
            f'<title>{escape(_title(n))}</title>'
            f'<rect x="{b.x:.1f}" y="{b.y:.1f}" width="{b.w:.1f}" height="{b.h:.1f}" rx="8"/>'
            f'<a href="{escape(job_url.format(id=n.id))}"><text x="{b.x + 10:.1f}" '
            f'y="{b.y + 15:.1f}">{escape(_label(n))}</text></a></g>')
    for u, v in lay.edges:
        a, b = lay.boxes[u], lay.boxes[v]
        x1, y1 = a.x + a.w, a.y + (min(a.h, NODE_H) / 2 if _is_box(graph, u) else a.h / 2)
        x2, y2 = b.x, b.y + (min(b.h, NODE_H) / 2 if _is_box(graph, v) else b.h / 2)
        dx = max(abs(x2 - x1) / 2, 24)
        hot = (u, v) in lay.blocking_edges
        # an edge into a job with a run condition (when="failed"/"finished"): dashed
        cond = v > 0 and v in graph.nodes and graph.nodes[v].kind in (S.ONFAIL, S.ALWAYS)
        out.append(
            f'<path class="edge{" hot" if hot else ""}{" cond" if cond else ""}" '
            f'data-from="{u}" data-to="{v}" '
            f'd="M{x1:.1f},{y1:.1f} C{x1 + dx:.1f},{y1:.1f} {x2 - dx:.1f},{y2:.1f} '
            f'{x2:.1f},{y2:.1f}" marker-end="url(#{"arrow-hot" if hot else "arrow"})"/>')
    for b in lay.boxes.values():
        if b.id < 0:
            counts = graph.hidden_children.get(-b.id, {})
            total = sum(counts.values())
            detail = ", ".join(f"{n:,} {s}" for s, n in sorted(counts.items()))
            out.append(
                f'<g class="summary"><title>{escape(detail)}</title>'
                f'<rect x="{b.x:.1f}" y="{b.y:.1f}" width="{b.w:.1f}" height="{b.h:.1f}" '
                f'rx="5"/><text x="{b.x + 10:.1f}" y="{b.y + 19:.1f}">'
                f'+{total:,} more</text></g>')
            continue
        n = graph.nodes[b.id]
        if n.kind == S.CONTAINER:
            continue
        cls = _cls(n, graph.focus, lay)
        out.append(
            f'<a href="{escape(job_url.format(id=n.id))}" class="node {cls}" '
            f'data-id="{n.id}" data-state="{n.state}"><title>{escape(_title(n))}</title>'
            f'<rect x="{b.x:.1f}" y="{b.y:.1f}" width="{b.w:.1f}" height="{b.h:.1f}" rx="5"/>'
            f'<text x="{b.x + 10:.1f}" y="{b.y + 19:.1f}">{escape(_label(n))}</text></a>')
    out.append("</svg>")
    return Markup("".join(out))


def _is_box(graph: Graph, i: int) -> bool:
    return i > 0 and graph.nodes[i].kind == S.CONTAINER


def _cls(n: Node, focus: int, lay: Layout) -> str:
    cls = f"s-{n.state}"
    if n.id == focus:
        cls += " focus"
    if n.id in lay.blocking_nodes:
        cls += " hot"
    return cls


def _label(n: Node) -> str:
    text = f"#{n.id} {n.type}"
    return text if len(text) <= 20 else text[:19] + "…"


def _title(n: Node) -> str:
    kind = "container" if n.kind == S.CONTAINER else "job"
    when = {S.ONFAIL: "; runs when a dependency failed", S.ALWAYS: "; runs when all finished"}
    return (f"{kind} #{n.id} {n.type} ({n.group}): {n.state}" + when.get(n.kind, "")
            + (f"; {n.note}" if n.note else ""))

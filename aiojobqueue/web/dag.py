"""The DAG page's drawing: a layered layout with containers as boxes, rendered as SVG.

No maintained Python layout library draws compound graphs (nodes inside boxes), so this is a
small one of our own, applied recursively: each container's children are laid out as a graph
of their own, and the container becomes one box of that size in its parent's layout. Within
one level: longest-path layering over the dependency edges lifted to that level (flowing left
to right), one column per layer, barycentre ordering to shorten edges.

No edge crosses a box: an edge is drawn between the two boxes its ends lift to at the level
where they part (a job inside a container reads as the container's edge there), as a
polyline that leaves its box level with its middle, crosses the gaps between columns, and
passes each column in between through a slot kept free for it (a dummy node); an edge
against the flow (a cycle closed by lifting) runs above the level's boxes. A layer of more
than ``FAN_MAX`` boxes (a wide fan-out) shows ``FAN_KEEP`` of them and one counted group box
for the rest, whose link draws them all (``expand``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import count, pairwise

from .. import schema as S
from .dagpaths import blocking, nearest
from .dagsvg import svg
from .data import Graph
from .views import DAG_FETCH

__all__ = ["Box", "Group", "Layout", "blocking", "layout", "nearest", "svg"]

NODE_W, NODE_H = 150, 30
#: A node with a subtitle (Node.subtitle) is this much taller.
SUB_H = 12
H_GAP, V_GAP = 48, 10
PAD, HEAD = 12, 22
#: The free slot a long edge passes a column through.
DUMMY_H = 4
#: A layer of more boxes than this is collapsed (unless expanded) to FAN_KEEP and a group.
FAN_MAX, FAN_KEEP = 24, 12
SUMMARY = -1  # summary boxes of a container's unfetched children: -(container id)
#: How far from the boxes an edge against the flow runs (within PAD and H_GAP / 2).
CHANNEL = 5
#: Ids of groups and dummies: below every summary id.
_PSEUDO = -(10**15)

Point = tuple[float, float]


@dataclass
class Box:
    """A placed node or container (absolute coordinates)."""

    id: int
    x: float
    y: float
    w: float
    h: float


@dataclass
class Group:
    """A collapsed part of a wide layer: the members not drawn, counted by state."""

    members: list[int]
    states: dict[str, int]


@dataclass
class Layout:
    """Positions of everything drawn, the edges' routes, and what the blocking path
    highlights. ``edges`` are the graph's edges with both ends drawn, each routed in
    ``routes``; ``group_edges`` the routes of the lifted edges into and out of groups."""

    boxes: dict[int, Box]
    width: float
    height: float
    edges: list[tuple[int, int]]
    blocking_nodes: set[int] = field(default_factory=set)
    blocking_edges: set[tuple[int, int]] = field(default_factory=set)
    not_drawn: int = 0
    routes: dict[tuple[int, int], list[Point]] = field(default_factory=dict)
    groups: dict[int, Group] = field(default_factory=dict)
    group_edges: dict[tuple[int, int], list[Point]] = field(default_factory=dict)
    #: The box each drawn edge connects at the level where its ends part.
    ends: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)


def layout(graph: Graph, expand: bool = False) -> Layout:
    """Lay out ``graph``: the DAG_DRAW nodes nearest the focus (DAG_FETCH and no collapsed
    layer when ``expand``)."""
    drawn = nearest(graph, DAG_FETCH) if expand else nearest(graph, fan=FAN_KEEP + 1)
    return _Placer(graph, drawn, expand).run()


class _Placer:
    """One layout: levels placed bottom-up (``place``), then made absolute (``absolute``)."""

    def __init__(self, graph: Graph, drawn: set[int], expand: bool) -> None:
        self.graph, self.drawn, self.expand = graph, drawn, expand
        self.nodes = {i: graph.nodes[i] for i in drawn}
        self.kids: dict[int | None, list[int]] = defaultdict(list)
        self.parent: dict[int, int | None] = {}
        for n in sorted(self.nodes.values(), key=lambda n: n.id):
            p = n.parent_id if n.parent_id in self.nodes else None
            self.kids[p].append(n.id)
            self.parent[n.id] = p
        for cid in graph.hidden_children:
            if cid in self.nodes:
                self.kids[cid].append(SUMMARY * cid)
                self.parent[SUMMARY * cid] = cid
        self.edges = [(u, v) for u, v in graph.edges if u in drawn and v in drawn]
        self.alias: dict[int, int] = {}  # a collapsed member -> its group
        self.groups: dict[int, Group] = {}
        self.ids = count(1)
        self.rel: dict[int, tuple[float, float, float, float]] = {}
        # per level (its container, None at the top): lifted edge -> the dummies it passes
        self.level_routes: list[
            tuple[int | None, int, int, list[int], list[tuple[int, int]]]] = []
        self.columns: dict[int | None, list[tuple[float, float]]] = {}
        self.layer_of: dict[int, int] = {}
        self.placed: dict[int | None, list[int]] = {}
        self.abs: dict[int, Box] = {}
        self.tops: dict[int | None, float] = {}
        self.cols_abs: dict[int | None, list[tuple[float, float]]] = {}

    def run(self) -> Layout:
        width, height = self.place(None)
        boxes: dict[int, Box] = {}
        self.absolute(None, PAD, PAD, boxes)
        lay = Layout(boxes, width + 2 * PAD, height + 2 * PAD, [], not_drawn=len(
            self.graph.nodes) - len(self.drawn), groups=self.groups)
        self.route(lay)
        lay.blocking_nodes, lay.blocking_edges = blocking(self.graph, self.drawn)
        return lay

    def is_box(self, m: int) -> bool:
        return m > 0 and self.nodes[m].kind == S.CONTAINER

    def size(self, m: int) -> tuple[float, float]:
        if m <= _PSEUDO * 2:  # a dummy
            return 0.0, DUMMY_H
        if self.is_box(m):
            w, h = self.place(m) if self.kids[m] else (NODE_W, 0.0)
            return max(w + 2 * PAD, NODE_W), h + HEAD + PAD
        sub = m > 0 and self.nodes[m].subtitle
        return NODE_W, NODE_H + (SUB_H if sub else 0)

    def lift(self, n: int, here: set[int]) -> int | None:
        """The member of this level that holds ``n`` (its group if collapsed), or None."""
        while True:
            if n in here:
                return n
            if self.alias.get(n) in here:
                return self.alias[n]
            p = self.parent.get(n)
            if p is None:
                return None
            n = p

    def place(self, level: int | None) -> tuple[float, float]:
        """Place one level's members relative to their block; returns the block's size."""
        members = list(self.kids[level])
        here = set(members)
        lifted = self.lifted(here)
        layer = _layers(members, lifted)
        if not self.expand:
            members, layer = self.collapse(members, layer)
            here = set(members)
            lifted = self.lifted(here)
        layers, chains = self.add_dummies(level, members, layer, lifted)
        sizes = {m: self.size(m) for lay in layers for m in lay}
        _order(layers, chains)
        x, height, cols = 0.0, 0.0, []
        for lay in layers:
            cw = max((sizes[m][0] for m in lay), default=0.0)
            ch = sum(sizes[m][1] for m in lay) + V_GAP * max(len(lay) - 1, 0)
            cols.append((x, cw, ch))
            height = max(height, ch)
            x += cw + H_GAP
        for lay, (cx, _cw, ch) in zip(layers, cols, strict=True):
            y = (height - ch) / 2
            for m in lay:
                w, h = sizes[m]
                self.rel[m] = (cx, y, w, h)
                y += h + V_GAP
        self.columns[level] = [(cx, cx + cw) for cx, cw, _ in cols]
        self.placed[level] = [m for lay in layers for m in lay]
        return max(x - H_GAP, 0.0), height

    def lifted(self, here: set[int]) -> dict[tuple[int, int], list[tuple[int, int]]]:
        """The edges between members of this level: lifted pair -> the graph's edges."""
        out: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
        for u, v in self.edges:
            a, b = self.lift(u, here), self.lift(v, here)
            if a is not None and b is not None and a != b:
                out[(a, b)].append((u, v))
        return out

    def collapse(self, members: list[int], layer: dict[int, int]
                 ) -> tuple[list[int], dict[int, int]]:
        """Each layer of more than FAN_MAX members keeps FAN_KEEP and one group for the rest."""
        by_layer: dict[int, list[int]] = defaultdict(list)
        for m in members:
            by_layer[layer[m]].append(m)
        hot, _ = blocking(self.graph, self.drawn)
        for k, lay in by_layer.items():
            if len(lay) <= FAN_MAX:
                continue
            ranked = sorted(lay, key=lambda m: self.rank(m, hot))
            gid = _PSEUDO - next(self.ids)
            states: dict[str, int] = defaultdict(int)
            for m in ranked[FAN_KEEP:]:
                self.alias[m] = gid
                if m < 0:  # a container's summary box: the children it stands for
                    for s, n in self.graph.hidden_children.get(-m, {}).items():
                        states[s] += n
                else:
                    states[self.nodes[m].state] += 1
            self.groups[gid] = Group(ranked[FAN_KEEP:], dict(states))
            layer[gid] = k
        mine = [g for g in self.groups if g in layer and g not in members]
        for m in members:  # a container's summary box joins the level's group: one count
            if m < 0 and m not in self.alias and m > _PSEUDO and mine:
                self.absorb(m, mine[0])
        kept = [m for m in members if m not in self.alias] + mine
        return kept, layer

    def absorb(self, summary: int, gid: int) -> None:
        group = self.groups[gid]
        self.alias[summary] = gid
        group.members.append(summary)
        for s, n in self.graph.hidden_children.get(-summary, {}).items():
            group.states[s] = group.states.get(s, 0) + n

    def rank(self, m: int, hot: set[int]) -> tuple[int, int, int]:
        """What a collapsed layer shows first: the focus, the blocking path, live states."""
        if m < 0:
            return (3, 0, -m)
        order = ("running", "failed", "leased", "ready", "external", "scheduled", "waiting",
                 "active", "cancelled", "done")
        state = self.nodes[m].state
        first = 0 if m == self.graph.focus else 1 if m in hot else 2
        return (first, order.index(state) if state in order else len(order), m)

    def add_dummies(self, level: int | None, members: list[int], layer: dict[int, int],
                    lifted: dict[tuple[int, int], list[tuple[int, int]]]
                    ) -> tuple[list[list[int]], list[list[int]]]:
        """The layers with a dummy in each layer a forward edge passes; the dummy chains."""
        n_layers = max((layer[m] for m in members), default=0) + 1
        layers: list[list[int]] = [[] for _ in range(n_layers)]
        for m in sorted(members):
            layers[layer[m]].append(m)
        chains: list[list[int]] = []
        for (a, b), true_edges in sorted(lifted.items()):
            dummies = []
            for k in range(layer[a] + 1, layer[b]):
                d = 2 * _PSEUDO - next(self.ids)
                self.layer_of[d] = k
                layers[k].append(d)
                dummies.append(d)
            chains.append([a, *dummies, b] if layer[a] < layer[b] else [])
            self.level_routes.append((level, a, b, dummies, true_edges))
        for m, k in layer.items():
            self.layer_of[m] = k
        return layers, [c for c in chains if c]

    def absolute(self, level: int | None, ox: float, oy: float, boxes: dict[int, Box]) -> None:
        """Absolute positions of one level's members (dummies too), then of their content."""
        self.tops[level] = oy
        self.cols_abs[level] = [(ox + x0, ox + x1) for x0, x1 in self.columns[level]]
        for m in self.placed[level]:
            x, y, w, h = self.rel[m]
            self.abs[m] = Box(m, ox + x, oy + y, w, h)
            if m > 2 * _PSEUDO:  # not a dummy
                boxes[m] = self.abs[m]
            if self.is_box(m):
                self.absolute(m, ox + x + PAD, oy + y + HEAD, boxes)

    def route(self, lay: Layout) -> None:
        """Each lifted edge's polyline; the graph's edges it stands for share it."""
        for level, a, b, dummies, true_edges in self.level_routes:
            pts = self.polyline(level, a, b, dummies)
            if a in self.groups or b in self.groups:
                lay.group_edges[(a, b)] = pts
                continue
            for e in true_edges:
                lay.edges.append(e)
                lay.routes[e] = pts
                lay.ends[e] = (a, b)

    def polyline(self, level: int | None, a: int, b: int, dummies: list[int]) -> list[Point]:
        """From a's right side to b's left side, crossing columns only in free slots."""
        cols, la, lb = self.cols_abs[level], self.layer_of[a], self.layer_of[b]
        ba, bb = self.abs[a], self.abs[b]
        ya = ba.y + (min(ba.h, NODE_H) / 2 if self.is_box(a) else ba.h / 2)
        yb = bb.y + (min(bb.h, NODE_H) / 2 if self.is_box(b) else bb.h / 2)
        start, end = (ba.x + ba.w, ya), (bb.x, yb)
        if la < lb:
            pts = [start, (cols[la][1], ya)]
            for d in dummies:
                box = self.abs[d]
                yd = box.y + DUMMY_H / 2
                k = self.layer_of[d]
                pts += [(cols[k][0], yd), (cols[k][1], yd)]
            return [*pts, (cols[lb][0], yb), end]
        # against the flow: down the gap after a's column, along the top, down before b's
        top = self.tops[level] - CHANNEL
        right, left = cols[la][1] + CHANNEL, cols[lb][0] - CHANNEL
        return [start, (right, ya), (right, top), (left, top), (left, yb), end]


def _layers(members: list[int], lifted: Iterable[tuple[int, int]]) -> dict[int, int]:
    """Longest-path layering. Lifting edges to one level can close a cycle the queue allows
    (a job depends on one child of a box, another child on it): the edges that close one
    are left out here (drawn against the flow) so the rest stay left to right."""
    succ: dict[int, set[int]] = {m: set() for m in members}
    for a, b in lifted:
        succ[a].add(b)
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
    todo = [m for m in members if indeg[m] == 0]
    while todo:
        m = todo.pop(0)
        for t in sorted(succ[m]):
            layer[t] = max(layer[t], layer[m] + 1)
            indeg[t] -= 1
            if indeg[t] == 0:
                todo.append(t)
    return layer


def _order(layers: list[list[int]], chains: list[list[int]]) -> None:
    """Order each layer (in place) by the barycentre of its neighbours in the next and the
    previous layer, a few sweeps each way: shorter edges, fewer crossings."""
    pred: dict[int, set[int]] = defaultdict(set)
    succ: dict[int, set[int]] = defaultdict(set)
    for chain in chains:
        for a, b in pairwise(chain):
            succ[a].add(b)
            pred[b].add(a)
    pos = {m: float(i) for lay in layers for i, m in enumerate(lay)}
    for sweep in range(4):
        down = sweep % 2 == 0
        near = pred if down else succ
        for i in range(1, len(layers)) if down else range(len(layers) - 2, -1, -1):
            def bary(m: int, near: dict[int, set[int]] = near) -> float:
                ns = [pos[n] for n in near[m] if n in pos]
                return sum(ns) / len(ns) if ns else pos[m]

            layers[i].sort(key=lambda m: (bary(m), m))
            for k, m in enumerate(layers[i]):
                pos[m] = float(k)

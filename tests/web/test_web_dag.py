"""The DAG drawing: the layout's promises on plain graphs, and the fetch on real databases."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable

import pytest
from dagcheck import Rect, crossings
from hypothesis import given, settings
from hypothesis import strategies as st

from aiojobqueue import JobQueue
from aiojobqueue.web import dag as D
from aiojobqueue.web import data as Q
from aiojobqueue.web import views as V
from aiojobqueue.web.data import Graph, Node


def graph(n: int, edges: list[tuple[int, int]], parents: dict[int, int] | None = None,
          states: dict[int, str] | None = None, focus: int = 1) -> Graph:
    parents = parents or {}
    containers = set(parents.values())
    nodes = {i: Node(i, "c" if i in containers else "t",
                     "container" if i in containers else "job",
                     (states or {}).get(i, "waiting"), parents.get(i), "g")
             for i in range(1, n + 1)}
    return Graph(focus, nodes, edges)


def inside(inner: D.Box, outer: D.Box) -> bool:
    return (outer.x < inner.x and inner.x + inner.w < outer.x + outer.w
            and outer.y < inner.y and inner.y + inner.h < outer.y + outer.h)


def overlap(a: D.Box, b: D.Box) -> bool:
    return not (a.x + a.w <= b.x or b.x + b.w <= a.x or a.y + a.h <= b.y or b.y + b.h <= a.y)


def acyclic(n: int, edges: set[tuple[int, int]], parents: dict[int, int]) -> bool:
    """The queue's rule: v waits on u for an edge; a container waits on its children; a
    child waits on what its containers wait on by edge. No wait may close a cycle."""
    waits: dict[int, set[int]] = {i: set() for i in range(1, n + 1)}
    for u, v in edges:
        waits[v].add(u)
    for c, p in parents.items():
        waits[p].add(c)
    for i in range(1, n + 1):
        p = parents.get(i)
        while p is not None:
            waits[i] |= {u for u, v in edges if v == p}
            p = parents.get(p)
    state: dict[int, int] = {}

    def visit(i: int) -> bool:
        state[i] = 1
        for j in waits[i]:
            if state.get(j) == 1 or (j not in state and not visit(j)):
                return False
        state[i] = 2
        return True

    if not all(i in state or visit(i) for i in range(1, n + 1)):
        return False
    # and drawable left to right: among the siblings of each box, the edges lifted to them
    # close no cycle (the layout drops such an edge; tested apart)
    def top(i: int, level: int | None) -> int | None:
        while parents.get(i) != level:
            if i not in parents:
                return None
            i = parents[i]
        return i

    for level in {None, *parents.values()}:
        lifted: dict[int, set[int]] = defaultdict(set)
        for u, v in edges:
            a, b = top(u, level), top(v, level)
            if a is not None and b is not None and a != b:
                lifted[b].add(a)
        seen: dict[int, int] = {}

        def ok(i: int, seen: dict[int, int] = seen,
               lifted: dict[int, set[int]] = lifted) -> bool:
            seen[i] = 1
            for j in lifted[i]:
                if seen.get(j) == 1 or (j not in seen and not ok(j)):
                    return False
            seen[i] = 2
            return True

        if not all(i in seen or ok(i) for i in list(lifted)):
            return False
    return True


@st.composite
def dags(draw: st.DrawFn) -> Graph:
    """Random DAGs with nested containers, kept only when the queue would accept them."""
    n = draw(st.integers(2, 40))
    parents: dict[int, int] = {}
    for i in range(2, n + 1):
        if draw(st.booleans()):
            parents[i] = draw(st.integers(1, i - 1))
    edges: set[tuple[int, int]] = set()
    for _ in range(draw(st.integers(0, 2 * n))):
        u = draw(st.integers(1, n - 1))
        v = draw(st.integers(u + 1, n))
        if acyclic(n, edges | {(u, v)}, parents):
            edges.add((u, v))
    return graph(n, sorted(edges), parents, focus=n)


def no_edge_crosses_a_box(lay: D.Layout) -> None:
    rects = [Rect(str(b.id), b.x, b.y, b.w, b.h) for b in lay.boxes.values()]
    edges = [(str(lay.ends[e][0]), str(lay.ends[e][1]), lay.routes[e]) for e in lay.edges]
    edges += [(str(a), str(b), pts) for (a, b), pts in lay.group_edges.items()]
    assert crossings(edges, rects) == []


@settings(max_examples=150, deadline=None)
@given(dags(), st.booleans())
def test_layout_promises(g: Graph, collapse: bool) -> None:
    lay = D.layout(g, expand=not collapse)
    no_edge_crosses_a_box(lay)
    if collapse:
        return
    assert set(lay.boxes) >= set(g.nodes)
    for i, n in g.nodes.items():
        if n.parent_id is not None:  # every node is drawn inside its container's box
            assert inside(lay.boxes[i], lay.boxes[n.parent_id])
    # siblings never overlap
    for i in g.nodes:
        for j in g.nodes:
            if i < j and g.nodes[i].parent_id == g.nodes[j].parent_id:
                assert not overlap(lay.boxes[i], lay.boxes[j]), (i, j)
    # between siblings, a dependency is left of what depends on it
    for u, v in g.edges:
        if g.nodes[u].parent_id == g.nodes[v].parent_id:
            assert lay.boxes[u].x + lay.boxes[u].w <= lay.boxes[v].x
    svg = str(D.svg(g, lay, "/jobs/{id}/dag"))
    assert svg.count('class="node') == sum(1 for n in g.nodes.values() if n.kind == "job")
    assert svg.count('class="edge') == len(g.edges)


def test_blocking_path_follows_unfinished_dependencies() -> None:
    # 1 -> 2 -> 4 and 3 -> 4; 1 done, 2 running, 3 done: 4 waits on 2 only
    g = graph(4, [(1, 2), (2, 4), (3, 4)], states={1: "done", 2: "running", 3: "done"},
              focus=4)
    lay = D.layout(g)
    assert lay.blocking_nodes == {2} and lay.blocking_edges == {(2, 4)}
    # through a container: 5 waits on container 1 whose child 3 waits on 2 (not done)
    g = graph(5, [(2, 3), (1, 5)], parents={2: 1, 3: 1}, states={2: "ready"}, focus=5)
    lay = D.layout(g)
    assert {1, 2, 3} <= lay.blocking_nodes and (1, 5) in lay.blocking_edges
    assert (2, 3) in lay.blocking_edges


def test_a_cycle_made_by_lifting_edges_is_broken() -> None:
    # 4 depends on child 2 of box 1, and child 3 depends on 4: box 1 <-> 4 when lifted
    g = graph(4, [(2, 4), (4, 3)], parents={2: 1, 3: 1}, focus=4)
    lay = D.layout(g)
    assert set(lay.boxes) == {1, 2, 3, 4} and len(lay.edges) == 2
    b1, b4 = lay.boxes[1], lay.boxes[4]
    assert b4.x >= b1.x + b1.w or b1.x >= b4.x + b4.w  # side by side, no overlap


def test_five_hundred_nodes_stay_readable_and_fast() -> None:
    # a fan-out of 498 between one source and one sink
    n = 500
    edges = [(1, i) for i in range(2, n)] + [(i, n) for i in range(2, n)]
    g = graph(n, edges, focus=n)
    t = time.perf_counter()
    lay = D.layout(g)
    svg = str(D.svg(g, lay, "/jobs/{id}/dag"))
    took = time.perf_counter() - t
    assert took < 1.0, took
    assert lay.not_drawn == 0 and len(lay.boxes) == 2 + D.FAN_KEEP + 1
    assert lay.height < 2500 and lay.width < 2500, (lay.width, lay.height)
    # the wide layer collapses: the first FAN_KEEP and one counted group for the rest
    assert svg.count('class="node') == 2 + D.FAN_KEEP
    (group,) = lay.groups.values()
    assert sum(group.states.values()) == n - 2 - D.FAN_KEEP
    no_edge_crosses_a_box(lay)
    # expanded, all of them, one column, and still no edge through a box
    t = time.perf_counter()
    lay = D.layout(g, expand=True)
    svg = str(D.svg(g, lay, "/jobs/{id}/dag"))
    assert time.perf_counter() - t < 1.0
    assert svg.count('class="node') == n and not lay.groups
    no_edge_crosses_a_box(lay)


def test_a_wide_layer_wrapped_into_columns_is_gone() -> None:
    """Issue 33: 20 children wrapped into two columns and the first column's edges ran into
    the second's boxes. Now one column per layer, and long edges pass through free slots."""
    edges = [(1, i) for i in range(2, 22)] + [(i, 22) for i in range(2, 22)] + [(1, 22)]
    g = graph(22, edges, focus=22)
    lay = D.layout(g)
    assert len({b.x for i, b in lay.boxes.items() if 2 <= i <= 21}) == 1
    assert len(lay.routes[(1, 22)]) > 4  # the long edge bends through the middle column
    no_edge_crosses_a_box(lay)


def test_beyond_the_limit_the_nearest_are_drawn() -> None:
    n = 900
    edges = [(i, i + 1) for i in range(1, n)]  # a chain; the focus in the middle
    g = graph(n, edges, focus=450)
    lay = D.layout(g)
    assert len(lay.boxes) == Q.DAG_DRAW and lay.not_drawn == n - Q.DAG_DRAW
    assert 450 in lay.boxes and 450 - 200 in lay.boxes and 450 + 200 in lay.boxes
    assert 1 not in lay.boxes and n not in lay.boxes


async def test_big_containers_are_summarised(make_queue: Callable[..., JobQueue],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(V, "DAG_CHILDREN", 5)
    q = make_queue()
    async with q:
        async with q.batch() as b:
            box = b.container("fan")
            kids = [b.add("t", {"i": i}, parent=box) for i in range(12)]
            after = b.add("sum", {}, depends_on=[box])
        await q.cancel(kids[-1].id)
        g = await Q.Data(q).dag(after.id)
        shown = [n for n in g.nodes.values() if n.parent_id == box.id]
        assert len(shown) == 5
        assert g.hidden_children[box.id] == {"ready": 6, "cancelled": 1}
        assert (box.id, after.id) in g.edges
        svg = str(D.svg(g, D.layout(g), "/jobs/{id}/dag"))
        assert "+7 more" in svg


async def test_dag_of_a_chain_and_a_nested_container(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()
    async with q:
        async with q.batch() as b:
            outer = b.container("outer")
            inner = b.container("inner", parent=outer)
            x = b.add("x", {}, parent=inner)
            y = b.add("y", {}, parent=outer, depends_on=[inner])
            z = b.add("z", {}, depends_on=[outer])
            w = b.add("w", {}, depends_on=[z])
        g = await Q.Data(q).dag(x.id)
        assert {outer.id, inner.id, x.id, y.id} <= set(g.nodes)
        # z and w hang off the container, not off x: the focus's closures over edges
        # reach them only through the container, which is drawn whole
        g2 = await Q.Data(q).dag(w.id)
        assert {outer.id, inner.id, x.id, y.id, z.id, w.id} <= set(g2.nodes)
        assert (inner.id, y.id) in g2.edges and (z.id, w.id) in g2.edges
        lay = D.layout(g2)
        assert inside(lay.boxes[x.id], lay.boxes[inner.id])
        assert inside(lay.boxes[inner.id], lay.boxes[outer.id])

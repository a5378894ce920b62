"""What the DAG page draws of a graph: the nodes nearest the focus (``nearest``), and the
path a waiting focus job waits on (``blocking``), highlighted by the drawing (dag.py)."""

from __future__ import annotations

from collections import defaultdict, deque

from .. import schema as S
from .data import DAG_DRAW, Graph


def nearest(graph: Graph, limit: int = DAG_DRAW, fan: int | None = None) -> set[int]:
    """The ``limit`` nodes closest to the focus (over edges and container membership), with
    the containers of each so every node is drawn in its box. With ``fan``, the new
    neighbours of one node count as ``fan`` at most (a wide fan-out the drawing collapses
    costs what it shows, so what lies beyond it is drawn too)."""
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
    cost = dict.fromkeys(graph.nodes, 1.0)
    spent = 0.0
    while todo and spent < limit:
        n = todo.popleft()
        keep.add(n)
        spent += cost[n]
        new = [m for m in sorted(adj[n]) if m not in seen]
        for m in new:
            seen.add(m)
            todo.append(m)
            if fan is not None and len(new) > fan:
                cost[m] = fan / len(new)
    for n in sorted(graph.nodes):  # what no edge reaches (fetched all the same)
        if spent >= limit:
            break
        if n not in keep:
            keep.add(n)
            spent += 1
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

"""The DAG page's SVG: boxes where dag.layout placed them, edges along its routes.

Edges carry an optional style per dependency (``Graph.when``, else the job's kind: a run
condition other than "done" is drawn dashed, classes ``cond when-<condition>``), and nodes
an optional second line (``Node.subtitle``) and a tooltip note (``Node.note``), so new facts
about the DAG need no change to the layout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from markupsafe import Markup, escape

from .. import schema as S
from .data import Graph, Node

if TYPE_CHECKING:
    from .dag import Layout

#: a job's run condition, as its kind says it (conditions.py): its incoming edges are dashed
KIND_WHEN = {S.ONFAIL: "failed", S.ALWAYS: "finished"}


def svg(graph: Graph, lay: Layout, job_url: str, expand_url: str | None = None) -> Markup:
    """The layout as an inline SVG; ``job_url`` has ``{id}`` where a job id goes;
    ``expand_url`` is where a collapsed group's link leads (the page drawing everything)."""
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
    out += _containers(graph, lay, job_url)
    out += _edges(graph, lay)
    for b in lay.boxes.values():
        if b.id in lay.groups:
            out.append(_group(lay, b.id, expand_url))
        elif b.id < 0:
            out.append(_summary(graph, lay, b.id, expand_url))
        elif graph.nodes[b.id].kind != S.CONTAINER:
            out.append(_node(graph, lay, b.id, job_url))
    out.append("</svg>")
    return Markup("".join(out))


def _d(points: list[tuple[float, float]]) -> str:
    first, *rest = points
    return f"M{first[0]:.1f},{first[1]:.1f}" + "".join(f" L{x:.1f},{y:.1f}" for x, y in rest)


def _edges(graph: Graph, lay: Layout) -> list[str]:
    out = []
    when = graph.when
    for u, v in lay.edges:
        hot = (u, v) in lay.blocking_edges
        n = graph.nodes.get(v) if v > 0 else None
        cond = when.get((u, v)) or (KIND_WHEN.get(n.kind, "done") if n else "done")
        cls = ("edge" + (" hot" if hot else "")
               + ("" if cond == "done" else f" cond when-{cond}"))
        a, b = lay.ends[(u, v)]
        out.append(
            f'<path class="{escape(cls)}" data-from="{u}" data-to="{v}" data-a="{a}" '
            f'data-b="{b}" d="{_d(lay.routes[(u, v)])}" '
            f'marker-end="url(#{"arrow-hot" if hot else "arrow"})"/>')
    for (a, b), pts in lay.group_edges.items():
        out.append(f'<path class="edge to-group" data-a="{a}" data-b="{b}" d="{_d(pts)}" '
                   'marker-end="url(#arrow)"/>')
    return out


def _containers(graph: Graph, lay: Layout, job_url: str) -> list[str]:
    out = []
    boxes = sorted((b for b in lay.boxes.values()
                    if b.id > 0 and graph.nodes[b.id].kind == S.CONTAINER),
                   key=lambda b: (b.w * b.h), reverse=True)
    for b in boxes:
        n = graph.nodes[b.id]
        out.append(
            f'<g class="container {_cls(n, graph.focus, lay)}" data-id="{n.id}" '
            f'data-state="{n.state}"><title>{escape(_title(n))}</title>'
            f'<rect x="{b.x:.1f}" y="{b.y:.1f}" width="{b.w:.1f}" height="{b.h:.1f}" rx="8"/>'
            f'<a href="{escape(job_url.format(id=n.id))}"><text x="{b.x + 10:.1f}" '
            f'y="{b.y + 15:.1f}">{escape(_label(n))}</text></a></g>')
    return out


def _node(graph: Graph, lay: Layout, i: int, job_url: str) -> str:
    b, n = lay.boxes[i], graph.nodes[i]
    sub = n.subtitle
    line2 = (f'<text class="sub" x="{b.x + 10:.1f}" y="{b.y + 33:.1f}">{escape(sub)}</text>'
             if sub else "")
    return (f'<a href="{escape(job_url.format(id=n.id))}" class="node '
            f'{_cls(n, graph.focus, lay)}" data-id="{n.id}" data-state="{n.state}">'
            f'<title>{escape(_title(n))}</title>'
            f'<rect x="{b.x:.1f}" y="{b.y:.1f}" width="{b.w:.1f}" height="{b.h:.1f}" rx="5"/>'
            f'<text x="{b.x + 10:.1f}" y="{b.y + 19:.1f}">{escape(_label(n))}</text>{line2}</a>')


def _counted(b_id: int, lay: Layout, total: int, detail: str, expand_url: str | None,
             cls: str) -> str:
    b = lay.boxes[b_id]
    inner = (f'<title>{escape(detail)}</title><rect x="{b.x:.1f}" y="{b.y:.1f}" '
             f'width="{b.w:.1f}" height="{b.h:.1f}" rx="5"/><text x="{b.x + 10:.1f}" '
             f'y="{b.y + 19:.1f}">+{total:,} more</text>')
    if expand_url is None:
        return f'<g class="{cls}" data-id="{b_id}" data-count="{total}">{inner}</g>'
    return (f'<a class="{cls}" data-id="{b_id}" data-count="{total}" '
            f'href="{escape(expand_url)}">{inner}</a>')


def _group(lay: Layout, gid: int, expand_url: str | None) -> str:
    states = lay.groups[gid].states
    total = sum(states.values())
    detail = ", ".join(f"{n:,} {s}" for s, n in sorted(states.items())) + " (click: show all)"
    return _counted(gid, lay, total, detail, expand_url, "group")


def _summary(graph: Graph, lay: Layout, sid: int, expand_url: str | None) -> str:
    counts = graph.hidden_children.get(-sid, {})
    detail = ", ".join(f"{n:,} {s}" for s, n in sorted(counts.items()))
    return _counted(sid, lay, sum(counts.values()), detail, expand_url, "summary")


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

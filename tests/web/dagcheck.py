"""Geometry of a drawn DAG: does an edge pass through a box it does not connect?

Edges are polylines (``M x,y L x,y ...``); boxes are rectangles. A segment crosses a box
when it enters the box's interior (shrunk by half a pixel: touching a border is not
crossing). The boxes an edge connects are not counted, nor the containers that hold the
whole edge (it is drawn inside them).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

Point = tuple[float, float]


@dataclass
class Rect:
    id: str
    x: float
    y: float
    w: float
    h: float

    def holds(self, p: Point) -> bool:
        return self.x <= p[0] <= self.x + self.w and self.y <= p[1] <= self.y + self.h


def points(d: str) -> list[Point]:
    """The vertices of a path made of M and L commands (the layout draws nothing else)."""
    assert re.fullmatch(r"M[-\d.]+,[-\d.]+( L[-\d.]+,[-\d.]+)*", d.strip()), d
    return [(float(x), float(y)) for x, y in re.findall(r"([-\d.]+),([-\d.]+)", d)]


def segment_enters(p: Point, q: Point, r: Rect, eps: float = 0.5) -> bool:
    """Liang-Barsky: whether p-q meets the open rectangle r shrunk by ``eps``."""
    x0, y0, x1, y1 = r.x + eps, r.y + eps, r.x + r.w - eps, r.y + r.h - eps
    if x0 >= x1 or y0 >= y1:
        return False
    dx, dy = q[0] - p[0], q[1] - p[1]
    lo, hi = 0.0, 1.0
    for den, num in ((-dx, p[0] - x0), (dx, x1 - p[0]), (-dy, p[1] - y0), (dy, y1 - p[1])):
        if den == 0:
            if num <= 0:
                return False
            continue
        t = num / den
        if den < 0:
            lo = max(lo, t)
        else:
            hi = min(hi, t)
        if lo >= hi:
            return False
    return True


def crossings(edges: list[tuple[str, str, list[Point]]], rects: list[Rect]
              ) -> list[tuple[str, str, str]]:
    """(a, b, box) for every edge from box a to box b that passes through another box."""
    bad = []
    for a, b, pts in edges:
        x0, x1 = min(p[0] for p in pts), max(p[0] for p in pts)
        y0, y1 = min(p[1] for p in pts), max(p[1] for p in pts)
        for r in rects:
            if r.x > x1 or r.x + r.w < x0 or r.y > y1 or r.y + r.h < y0:
                continue  # far from this edge
            if r.id in (a, b) or all(r.holds(p) for p in pts):
                continue
            if any(segment_enters(p, q, r) for p, q in itertools.pairwise(pts)):
                bad.append((a, b, r.id))
    return bad


# Read in the browser: every box's rectangle and every edge's path, from the live SVG.
READ_SVG = """() => {
  const svg = document.querySelector('svg.dag');
  const rects = [...svg.querySelectorAll('[data-id] > rect, [data-id] rect')].map(r => {
    const owner = r.closest('[data-id]');
    return {id: owner.getAttribute('data-id'), x: +r.getAttribute('x'),
            y: +r.getAttribute('y'), w: +r.getAttribute('width'),
            h: +r.getAttribute('height')};
  });
  const edges = [...svg.querySelectorAll('path.edge')].map(p => ({
    a: p.getAttribute('data-a'), b: p.getAttribute('data-b'), d: p.getAttribute('d')}));
  return {rects, edges, width: +svg.getAttribute('width'), height: +svg.getAttribute('height')};
}"""

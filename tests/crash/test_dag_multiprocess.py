"""The flagship: a random DAG of several hundred jobs (nested containers, fan-out, fan-in,
edges to containers) run by 3 worker processes at once. The per-process event logs plus the
database prove that no job started before its dependencies and its containers'
dependencies had ended, that every job ran exactly once, and that everything is done."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from aiojobqueue import JobQueue

WORKER = Path(__file__).resolve().parents[1] / "dagworker.py"
N_NODES = 480
N_PROCS = 3


@dataclass
class Node:
    box: bool
    parent: int | None
    deps: list[int] = field(default_factory=list)


def _waits(nodes: list[Node]) -> dict[Any, set[Any]]:
    """The wait graph, as the library defines it: a node waits for its deps; a container
    for its children; a child for its container's gate; a gate for the container's deps and
    for its own container's gate."""
    g: dict[Any, set[Any]] = defaultdict(set)
    for i, n in enumerate(nodes):
        for d in n.deps:
            g[i].add(d)
            g[("g", i)].add(d)
        if n.parent is not None:
            g[n.parent].add(i)
            g[i].add(("g", n.parent))
            g[("g", i)].add(("g", n.parent))
    return g


def _reaches(g: dict[Any, set[Any]], start: Any, goal: Any) -> bool:
    stack, seen = [start], {start}
    while stack:
        u = stack.pop()
        if u == goal:
            return True
        for v in g.get(u, ()):
            if v not in seen:
                seen.add(v)
                stack.append(v)
    return False


def random_dag(rng: random.Random, n: int) -> list[Node]:
    nodes: list[Node] = []
    for i in range(n):
        boxes = [j for j, x in enumerate(nodes) if x.box]
        parent = rng.choice(boxes) if boxes and rng.random() < 0.6 else None
        node = Node(box=i > 0 and rng.random() < 0.12, parent=parent)
        nodes.append(node)
        g = _waits(nodes)
        # a new child of C closes a cycle iff C's gate already waits for C
        if parent is not None and _reaches(g, ("g", parent), parent):
            node.parent = None
            g = _waits(nodes)
        k = rng.choice([0, 0, 1, 1, 1, 2, 3])
        if rng.random() < 0.04:
            k = 12  # fan-in
        for _ in range(min(k, i)):
            # hubs: early nodes get many dependents (fan-out)
            v = rng.randrange(min(i, 8)) if rng.random() < 0.3 else rng.randrange(i)
            if v in node.deps:
                continue
            # i (and everything in it) waits for v: refused if v already waits for i
            if _reaches(g, v, i) or _reaches(g, v, ("g", i)):
                continue
            node.deps.append(v)
            g = _waits(nodes)
    return nodes


def _read_logs(paths: list[Path]) -> tuple[dict[int, list[tuple[str, int, float, int]]], set[int]]:
    events: dict[int, list[tuple[str, int, float, int]]] = defaultdict(list)
    pids: set[int] = set()
    for p in paths:
        if not p.exists():
            continue
        for line in p.read_text().splitlines():
            kind, jid, attempt, ts, pid = line.split()
            events[int(jid)].append((kind, int(attempt), float(ts), int(pid)))
            pids.add(int(pid))
    return events, pids


@pytest.mark.slow
async def test_random_dag_three_processes(
    make_queue: Callable[..., JobQueue], db_url: str, prefix: str, tmp_path: Path, db: str
) -> None:
    rng = random.Random(20261129)
    nodes = random_dag(rng, N_NODES)
    q = make_queue()
    async with q:
        async with q.batch() as b:
            refs: list[Any] = []
            for i, n in enumerate(nodes):
                parent = refs[n.parent] if n.parent is not None else None
                deps = [refs[d] for d in n.deps]
                if n.box:
                    refs.append(b.container("box", parent=parent, depends_on=deps))
                else:
                    refs.append(b.add("work", {"n": i}, parent=parent, depends_on=deps))
        ids = [r.id for r in refs]
        index = {jid: i for i, jid in enumerate(ids)}

        go = tmp_path / "go"
        logs = [tmp_path / f"events-{k}.log" for k in range(N_PROCS)]
        procs = [
            subprocess.Popen(  # noqa: ASYNC220 - spawning is quick; the wait is polled
                [sys.executable, str(WORKER), "dag", db_url, prefix, str(p), str(go)])
            for p in logs
        ]
        t0 = time.monotonic()
        try:
            await asyncio.sleep(0.5)  # let them import and connect; they wait for `go`
            go.touch()
            deadline = time.monotonic() + 90
            # polling child processes: there is no event to wait on
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
        elapsed = time.monotonic() - t0
        assert [p.returncode for p in procs] == [0] * N_PROCS, "a worker process failed"

        J = q._t.jobs

        async def read(conn: Any) -> list[Any]:
            return list(await conn.execute(select(J.c.id, J.c.state, J.c.attempts, J.c.kind)))

        rows = await q._read(read)

    # -- the database: everything done, each leaf in exactly one attempt --------------------
    assert len(rows) == len(nodes)
    assert {r.state for r in rows} == {"done"}, sorted({r.state for r in rows})
    for r in rows:
        assert r.attempts == (0 if nodes[index[r.id]].box else 1), r

    # -- the logs: one start and one end per leaf, in that order, in one process -------------
    events, pids = _read_logs(logs)
    start: dict[int, float] = {}
    end: dict[int, float] = {}
    for i, n in enumerate(nodes):
        ev = events.get(ids[i], [])
        if n.box:
            assert ev == [], f"container {ids[i]} ran"
            continue
        kinds = sorted(e[0] for e in ev)
        assert kinds == ["E", "S"], f"job {ids[i]} events {ev}"  # none re-run, none twice
        (s,) = [e for e in ev if e[0] == "S"]
        (e,) = [e for e in ev if e[0] == "E"]
        assert s[1] == e[1] == 1 and s[3] == e[3] and s[2] <= e[2]
        start[i], end[i] = s[2], e[2]
    assert len(pids) >= 2, "only one process did any work"

    # -- ordering: no leaf started before all its deps and its containers' deps ended ------
    children: dict[int, list[int]] = defaultdict(list)
    for i, n in enumerate(nodes):
        if n.parent is not None:
            children[n.parent].append(i)

    def ancestors(i: int) -> list[int]:
        out, p = [], nodes[i].parent
        while p is not None:
            out.append(p)
            p = nodes[p].parent
        return out

    def effective_deps(i: int) -> list[int]:
        return [d for a in [i, *ancestors(i)] for d in nodes[a].deps]

    finished: dict[int, float] = {}

    def finish_time(i: int) -> float:
        """When node i had ended: a leaf's end; a container's last child (an empty one
        finishes as soon as its own gate opens)."""
        if i in finished:
            return finished[i]
        if not nodes[i].box:
            t = end[i]
        elif children[i]:
            t = max(finish_time(c) for c in children[i])
        else:
            t = max((finish_time(d) for d in effective_deps(i)), default=float("-inf"))
        finished[i] = t
        return t

    checked = 0
    for i, n in enumerate(nodes):
        if n.box:
            continue
        for d in effective_deps(i):
            assert start[i] > finish_time(d), (
                f"job {ids[i]} started at {start[i]} before {ids[d]} ended at {finish_time(d)}")
            checked += 1
    n_boxes = sum(n.box for n in nodes)
    nested = sum(1 for n in nodes if n.box and n.parent is not None)
    assert checked > len(nodes) and n_boxes >= 20 and nested >= 5
    print(f"\n[{db}] random DAG: {len(nodes)} nodes ({n_boxes} containers, {nested} nested), "
          f"{checked} ordering checks, {len(pids)} processes, {elapsed:.1f}s")

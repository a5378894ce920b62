"""What seeing inside costs the hot path: an A/B/C of drains on all three databases.

    git worktree add --detach /tmp/ajq-old 033873a     # the tree before issue 20
    PYTHONPATH=$PWD /work/venv/bin/python bench/obs_ab.py --old /tmp/ajq-old \\
        [--base TREE] [--dbs sqlite,postgresql,mariadb] [--shapes flat,dag] [--conc 10,50]
        [--rounds 3] [--no-sdk]

Three variants (four with ``--base``), each in a fresh process importing its own
``aiojobqueue``:

* ``old``: ``--old`` (no progress, errors history, explain, metrics or tracing);
* ``base`` (optional): ``--base``, e.g. the commit this branch started from, to tell what
  the branch costs from what came before it;
* ``off``: this checkout, OpenTelemetry not configured (the API installed, no provider);
* ``on``: this checkout with the OpenTelemetry SDK on: a TracerProvider (always sampled)
  whose BatchSpanProcessor hands every span to an exporter that drops it, so the spans are
  made, recorded and exported, and the enqueue stores the trace context with every job.

Each measurement: a fresh table prefix, ``--n`` no-op jobs enqueued (``flat``: batches of
1,000; ``dag``: bench/run.py's shape, 20 layers of a container holding a head, a fan-out
on it and a fan-in, each layer depending on the one before), then one worker at capacity C
drains them (``run_until_idle``): jobs/s from the first start to the last end, and the
worker process's CPU time per job over the same span (all of it on SQLite; the client's
share on the servers). A round runs the variants back to back for every (database, shape,
C), rotating which goes first; reported per cell: the medians of each variant and the
median of the per-round ratios off / old (the 3% budget), off / base and on / off (the
SDK's price), for the rate and for the CPU per job. On a loaded machine the wall-clock
rate swings by tens of per cent between runs; the CPU per job much less.

Databases: SQLite (a file under a temp dir), PostgreSQL ``AIOJOBQUEUE_TEST_PG`` (default
postgres@127.0.0.1:5432/test), MariaDB ``AIOJOBQUEUE_TEST_MYSQL`` (root@127.0.0.1:3306/test).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
URLS = {
    "postgresql": os.environ.get("AIOJOBQUEUE_TEST_PG",
                                 "postgresql+asyncpg://postgres@127.0.0.1:5432/test"),
    "mariadb": os.environ.get("AIOJOBQUEUE_TEST_MYSQL",
                              "mysql+aiomysql://root@127.0.0.1:3306/test"),
}


def sdk_on() -> None:
    """The OpenTelemetry SDK, every span sampled, batched to an exporter that drops them."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Drop(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    trace.set_tracer_provider(provider)


async def build(q: Any, n: int, dag: bool) -> int:
    """Enqueue ``n`` no-op jobs (flat, or run.py's 20-layer DAG); returns the count."""
    if not dag:
        for i in range(0, n, 1000):
            async with q.batch() as b:
                for _ in range(min(1000, n - i)):
                    b.add("noop", {})
        return n
    layers = 20
    width = max(n // layers - 2, 1)
    prev: Any = None
    total = 0
    for _ in range(layers):
        async with q.batch() as b:
            box = b.container("layer", depends_on=[prev] if prev is not None else [])
            head = b.add("noop", {}, parent=box)
            fan = [b.add("noop", {}, parent=box, depends_on=[head]) for _ in range(width)]
            b.add("noop", {}, parent=box, depends_on=fan)
        prev = box.id
        total += width + 2
    return total


async def child(db: str, shape: str, conc: int, n: int, otel: bool) -> tuple[float, float]:
    """(jobs/s, CPU microseconds of this process per job) of one drain."""
    from aiojobqueue import JobQueue

    if otel:
        sdk_on()
    url = URLS.get(db) or f"sqlite+aiosqlite:///{tempfile.mkdtemp()}/ab.db"
    q = JobQueue(url, prefix=f"ab{uuid.uuid4().hex[:8]}_", capacity=conc)
    marks: list[tuple[float, float]] = []

    @q.handler("noop")
    async def noop(ctx: Any) -> None:
        now = (time.perf_counter(), time.process_time())
        if not marks:
            marks.append(now)
        marks[1:] = [now]

    async with q:
        try:
            total = await build(q, n, shape == "dag")
            await q.run_until_idle()
        finally:
            async with q.engine.begin() as conn:
                await conn.run_sync(q._t.metadata.drop_all)
    (t0, c0), (t1, c1) = marks[0], marks[-1]
    return total / (t1 - t0), (c1 - c0) / total * 1e6


def one(tree: str, variant: str, db: str, shape: str, conc: int, n: int
        ) -> tuple[float, float]:
    """One drain in a fresh process importing aiojobqueue from ``tree``."""
    env = {**os.environ, "PYTHONPATH": tree}
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--dbs", db, "--shapes",
           shape, "--conc", str(conc), "--n", str(n)] + (["--otel"] if variant == "on" else [])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise SystemExit(f"{variant} {db} {shape} C={conc}: {out.stderr[-2000:]}")
    rate, cpu = out.stdout.split()[-2:]
    return float(rate), float(cpu)


def load() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", help="the tree before issue 20")
    ap.add_argument("--base", help="another tree to compare with (optional)")
    ap.add_argument("--dbs", default="sqlite,postgresql,mariadb")
    ap.add_argument("--shapes", default="flat,dag")
    ap.add_argument("--conc", default="10,50")
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-sdk", action="store_true",
                    help="leave out the variant with the OpenTelemetry SDK on (old against off)")
    ap.add_argument("--otel", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        rate, cpu = asyncio.run(child(a.dbs, a.shapes, int(a.conc), a.n, a.otel))
        print(f"{rate:.3f} {cpu:.3f}")
        return
    if not a.old:
        ap.error("--old is required")
    trees = {"old": a.old, **({"base": a.base} if a.base else {}), "off": ROOT,
             **({} if a.no_sdk else {"on": ROOT})}
    variants = tuple(trees)
    cells = [(db, shape, int(c)) for db in a.dbs.split(",") for shape in a.shapes.split(",")
             for c in a.conc.split(",")]
    got: dict[tuple[str, str, int], dict[str, list[tuple[float, float]]]] = {
        cell: {v: [] for v in variants} for cell in cells}
    loads = [load()]
    for r in range(a.rounds):
        for k, cell in enumerate(cells):
            turn = (r + k) % len(variants)
            order = variants[turn:] + variants[:turn]
            for v in order:
                got[cell][v].append(one(trees[v], v, *cell, a.n))
            m = got[cell]
            rates = "  ".join(f"{v} {m[v][-1][0]:7,.0f}/s {m[v][-1][1]:5.0f}us"
                              for v in variants)
            print(f"  round {r + 1} {cell[0]:10s} {cell[1]:4s} C={cell[2]:<3d} {rates}"
                  f"  (load {load()})", flush=True)
        loads.append(load())
    print(f"\n{a.rounds} rounds of N={a.n:,}; load average (1/5/15 min) at each round's end: "
          + "; ".join(loads))
    ratios = [("off", "old"), *([("off", "base")] if a.base else []),
              *([] if a.no_sdk else [("on", "off")])]
    for k, (what, fmt) in enumerate((("jobs/s", "{:,.0f}"), ("CPU us/job", "{:,.1f}"))):
        print("\n| database | drain | C | " + " | ".join(f"{v} {what}" for v in variants)
              + " | " + " | ".join(f"{x} / {y}" for x, y in ratios) + " |")
        print("|---" * (3 + len(variants) + len(ratios)) + "|")
        for (db, shape, c), m in got.items():
            med = [fmt.format(statistics.median(r[k] for r in m[v])) for v in variants]
            rs = [f"{statistics.median(p[k] / q[k] for p, q in zip(m[x], m[y], strict=True)):.3f}"
                  for x, y in ratios]
            print(f"| {db} | {shape} | {c} | " + " | ".join(med + rs) + " |")


if __name__ == "__main__":
    main()

"""Workflows: the release of a wide fan-out by ``complete()`` of an external step against
the same release by a finished job, same run, alternated, one table:

    .venv/bin/python bench/workflows.py [--wide 10000] [--pairs 3] [--dbs sqlite,postgresql,mariadb]

With ``--ab OLD_TREE`` (a checkout of the code to compare, e.g. ``git worktree add
--detach /tmp/old main``) it measures instead the ``finished`` release alone, in fresh
processes alternating this checkout and OLD_TREE: what the release's new SET clauses (an
external step's start and deadline, release.unblock) cost a finished job's fan-out.

Each round enqueues an upstream and ``--wide`` jobs depending on it (their type has no
handler here, so they stay ready once released), then ends the upstream and measures the
milliseconds from the end (the handler's return; the call of ``complete()``) until no
dependent is waiting any more (polled every 5 ms on another connection). ``finished``:
the upstream is a no-op job run by this process's worker (its one-call finalize, and the
split release of a wide fan-out where the dialect has one). ``complete``: the upstream is
an external step. Reported per database: the medians and the median of the per-pair
ratios complete / finished (<= 1: complete() is as fast). Fresh table prefix per round.

With ``--drain``: a head job, ``--wide`` jobs depending on it and one fan-in depending on
all of them, drained by this process's worker (``run_until_idle``, capacity 50), the fan-in
with ``when="finished"`` against the same DAG without it, alternated; jobs/s and the median
per-pair ratio (>= 0.9 is issue 32's bar)."""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import create_async_engine

from aiojobqueue import JobContext, JobQueue
from aiojobqueue.schema import build_tables

URLS = {"sqlite": "sqlite+aiosqlite:////tmp/ajq_bench_workflows.db",
        "postgresql": "postgresql+asyncpg://postgres@127.0.0.1:5432/test",
        "mariadb": "mysql+aiomysql://root@127.0.0.1:3306/test"}


async def _until_released(q: JobQueue, ids: list[int]) -> float:
    """Poll until none of ``ids`` waits; the time (monotonic) it was seen."""
    J = q._t.jobs
    lo, hi = min(ids), max(ids)
    while True:
        async with q.engine.connect() as conn:
            n = (await conn.execute(select(func.count()).select_from(J).where(
                J.c.id.between(lo, hi), J.c.state == "waiting"))).scalar_one()
        if n == 0:
            return time.monotonic()
        await asyncio.sleep(0.005)


async def one(url: str, wide: int, external: bool) -> float:
    """ms from the upstream's end to the last dependent's release."""
    prefix = f"wb{uuid.uuid4().hex[:8]}_"
    q = JobQueue(url, prefix=prefix, poll_interval=0.05)
    ended: list[float] = []
    ran = asyncio.Event()

    @q.handler("head")
    async def head(ctx: JobContext) -> None:
        ended.append(time.monotonic())
        ran.set()

    try:
        async with q:
            async with q.batch() as b:
                up = b.external("gate") if external else b.add("head")
                deps = [b.add("leaf", depends_on=[up]) for _ in range(wide)]
            ids = [d.id for d in deps]
            if external:
                t0 = time.monotonic()
                await q.complete(up.id)
                t1 = await _until_released(q, ids)
            else:
                worker = asyncio.create_task(q.serve())
                await ran.wait()
                t0 = ended[0]
                t1 = await _until_released(q, ids)
                worker.cancel()
                await asyncio.gather(worker, return_exceptions=True)
            return (t1 - t0) * 1000
    finally:
        engine = create_async_engine(url)
        async with engine.begin() as conn:
            await conn.run_sync(build_tables(prefix).metadata.drop_all)
        await engine.dispose()


async def drain(url: str, wide: int, when: str) -> float:
    """jobs/s of the fan-out / fan-in DAG (see the module docstring)."""
    prefix = f"wd{uuid.uuid4().hex[:8]}_"
    q = JobQueue(url, prefix=prefix, capacity=50)

    @q.handler("w")
    async def w(ctx: JobContext) -> None:
        return None

    try:
        async with q:
            async with q.batch() as b:
                head = b.add("w")
                leaves = [b.add("w", depends_on=[head]) for _ in range(wide)]
                fan_in = b.add("w", depends_on=leaves, when=when)
            t0 = time.monotonic()
            await q.run_until_idle()
            took = time.monotonic() - t0
            assert (await q.get(fan_in.id)).state == "done"
            return (wide + 2) / took
    finally:
        engine = create_async_engine(url)
        async with engine.begin() as conn:
            await conn.run_sync(build_tables(prefix).metadata.drop_all)
        await engine.dispose()


async def drains(a: argparse.Namespace) -> None:
    print(f"fan-out of {a.wide} and a fan-in, drained: jobs/s (median of {a.pairs} pairs)")
    print(f"{'database':<12}{'when=done':>11}{'when=finished':>15}{'ratio f/d':>11}")
    for name in a.dbs.split(","):
        got: dict[str, list[float]] = {"done": [], "finished": []}
        for i in range(a.pairs):
            for when in (("done", "finished") if i % 2 == 0 else ("finished", "done")):
                got[when].append(await drain(URLS[name], a.wide, when))
        ratio = statistics.median(f / d for f, d in zip(got["finished"], got["done"],
                                                         strict=True))
        print(f"{name:<12}{statistics.median(got['done']):>11.0f}"
              f"{statistics.median(got['finished']):>15.0f}{ratio:>11.2f}", flush=True)


def ab(a: argparse.Namespace) -> None:
    """The finished job's release, this checkout against ``a.ab``, fresh processes."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    print(f"release of {a.wide} dependents by a finished job, ms (median of {a.pairs} pairs)")
    print(f"{'database':<12}{'old tree':>10}{'this tree':>11}{'ratio new/old':>15}")
    for name in a.dbs.split(","):
        got: dict[str, list[float]] = {"old": [], "new": []}
        for i in range(a.pairs):
            for which in (("old", "new") if i % 2 == 0 else ("new", "old")):
                tree = a.ab if which == "old" else here
                out = subprocess.run(
                    [sys.executable, __file__, "--child", name, "--wide", str(a.wide)],
                    env={**os.environ, "PYTHONPATH": tree}, cwd=tree, capture_output=True,
                    text=True, check=True).stdout
                got[which].append(float(out.split()[-1]))
        ratio = statistics.median(n / o for n, o in zip(got["new"], got["old"], strict=True))
        print(f"{name:<12}{statistics.median(got['old']):>10.0f}"
              f"{statistics.median(got['new']):>11.0f}{ratio:>15.2f}", flush=True)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wide", type=int, default=10000)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--dbs", default="sqlite,postgresql,mariadb")
    ap.add_argument("--ab", help="a checkout to compare the finished job's release with")
    ap.add_argument("--drain", action="store_true", help="the when='finished' fan-in drain")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.drain:
        await drains(a)
        return
    if a.child:
        print(await one(URLS[a.child], a.wide, False))
        return
    if a.ab:
        await asyncio.to_thread(ab, a)
        return
    print(f"release of {a.wide} dependents, ms from the upstream's end (median of "
          f"{a.pairs} pairs, alternated)")
    print(f"{'database':<12}{'finished job':>14}{'complete()':>12}{'ratio c/f':>11}")
    for name in a.dbs.split(","):
        fin: list[float] = []
        com: list[float] = []
        for i in range(a.pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            for ext in order:
                (com if ext else fin).append(await one(URLS[name], a.wide, ext))
        ratio = statistics.median(c / f for c, f in zip(com, fin, strict=True))
        print(f"{name:<12}{statistics.median(fin):>14.0f}{statistics.median(com):>12.0f}"
              f"{ratio:>11.2f}", flush=True)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

"""A cleanup that runs on failure: ``when="failed"`` (and a report with ``when="finished"``).

An import creates a staging table, loads two files into it and publishes it. If any step
fails, ``drop_staging`` runs (after every step has ended) and removes what was left half
done; if all went well it is cancelled with ``ConditionNotMet``. ``report`` runs either way.

    python examples/cleanup_on_failure.py                 # embedded SQLite in a temp dir
    AIOJOBQUEUE_URL=postgresql+asyncpg://localhost/db python examples/cleanup_on_failure.py
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from typing import Any

from aiojobqueue import JobContext, JobQueue, PermanentError

STAGING: set[str] = set()  # stand-in for a database's tables


def make_queue(url: str) -> JobQueue:
    q = JobQueue(url, poll_interval=0.1, prefix=os.environ.get("AIOJOBQUEUE_PREFIX", "ajq_"))

    @q.handler("create_staging")
    async def create_staging(ctx: JobContext, run: str) -> None:
        STAGING.add(run)

    @q.handler("load")
    async def load(ctx: JobContext, run: str, file: str) -> int:
        if file.endswith(".corrupt"):
            raise PermanentError(f"{file}: bad header")
        return 100

    @q.handler("publish")
    async def publish(ctx: JobContext, run: str) -> str:
        return f"published {run}"

    @q.handler("drop_staging")
    async def drop_staging(ctx: JobContext, run: str) -> str:
        STAGING.discard(run)
        return f"dropped staging of {run}"

    @q.handler("report")
    async def report(ctx: JobContext, run: str) -> dict[str, Any]:
        ends = await ctx.dependency_results()
        return {"run": run, "published": any(isinstance(v, str) for v in ends.values())}

    return q


async def run_import(q: JobQueue, run: str, files: list[str]) -> dict[str, Any]:
    async with q.batch() as b:
        staged = b.add("create_staging", {"run": run})
        loads = [b.add("load", {"run": run, "file": f}, depends_on=[staged]) for f in files]
        pub = b.add("publish", {"run": run}, depends_on=loads)
        steps = [staged, *loads, pub]
        cleanup = b.add("drop_staging", {"run": run}, depends_on=steps, when="failed")
        rep = b.add("report", {"run": run}, depends_on=[pub], when="finished")
    await q.run_until_idle()
    c, r = await q.get(cleanup.id), await q.get(rep.id)
    return {"cleanup": c.state.value, "why": (c.error or {}).get("type"), "report": r.result}


async def main(url: str) -> None:
    q = make_queue(url)
    async with q:
        for run, files in (("good", ["a.csv", "b.csv"]), ("bad", ["a.csv", "b.corrupt"])):
            out = await run_import(q, run, files)
            print(f"{run}: cleanup {out['cleanup']}"
                  f"{' (' + out['why'] + ')' if out['why'] else ''}, "
                  f"published {out['report']['published']}, staging left: {sorted(STAGING)}")


if __name__ == "__main__":
    url = os.environ.get("AIOJOBQUEUE_URL")
    if url is None:
        url = f"sqlite+aiosqlite:///{tempfile.mkdtemp()}/cleanup.db"
    asyncio.run(main(url))

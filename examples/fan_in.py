"""Fan-in through a container: 5 ``fetch`` jobs in a container, one ``merge`` that depends
on the container and reads every child's result with ``ctx.dependency_results()``
(a container maps to ``{child id: result}`` of every job it holds, nested ones included).

    python examples/fan_in.py                     # embedded SQLite in a temp dir
    AIOJOBQUEUE_URL=postgresql+asyncpg://localhost/db python examples/fan_in.py
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from typing import Any

from aiojobqueue import JobContext, JobQueue

CITIES = ["Lyon", "Oslo", "Lima", "Pune", "Kobe"]


def make_queue(url: str) -> JobQueue:
    q = JobQueue(url, poll_interval=0.1, prefix=os.environ.get("AIOJOBQUEUE_PREFIX", "ajq_"))

    @q.handler("fetch")
    async def fetch(ctx: JobContext, city: str) -> dict[str, Any]:
        await asyncio.sleep(0.01)  # stand-in for an HTTP call
        return {"city": city, "temp": len(city) * 4}

    @q.handler("merge")
    async def merge(ctx: JobContext) -> dict[str, Any]:
        (readings,) = (await ctx.dependency_results()).values()  # {fetch id: result}
        temps = {r["city"]: r["temp"] for r in readings.values()}
        return {"cities": len(temps), "warmest": max(temps, key=lambda c: temps[c]),
                "mean": sum(temps.values()) / len(temps)}

    return q


async def main(url: str) -> None:
    q = make_queue(url)
    async with q:
        async with q.batch() as b:
            box = b.container("weather")
            for city in CITIES:
                b.add("fetch", {"city": city}, parent=box)
            merged = b.add("merge", depends_on=[box])
        await q.run_until_idle()
        r = await q.wait(merged.id)
        print(f"{r['cities']} cities, warmest {r['warmest']}, mean {r['mean']:.1f}")


if __name__ == "__main__":
    url = os.environ.get("AIOJOBQUEUE_URL")
    if url is None:
        url = f"sqlite+aiosqlite:///{tempfile.mkdtemp()}/fan_in.db"
    asyncio.run(main(url))
    sys.exit(0)

"""A dynamic DAG: a job that discovers work at run time and adds it with ``ctx.batch()``.

``crawl`` looks at a (fake) site map, then adds one ``fetch`` per page inside a container and
a ``summarise`` that waits for the whole container. The pages are only known once ``crawl``
runs, so the DAG grows while it executes. Because ``crawl`` returns the id of
``summarise``, a caller can wait for the end of the whole crawl.

    python examples/dynamic_dag.py                     # embedded SQLite in a temp dir
    AIOJOBQUEUE_URL=postgresql+asyncpg://localhost/db python examples/dynamic_dag.py
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from typing import Any

from aiojobqueue import JobContext, JobQueue

SITES = {
    "docs.example": ["/", "/install", "/tutorial", "/api", "/faq"],
    "blog.example": ["/", "/2024/hello", "/2025/dags"],
}


def make_queue(url: str) -> JobQueue:
    q = JobQueue(url, concurrency=4, poll_interval=0.1,
                 prefix=os.environ.get("AIOJOBQUEUE_PREFIX", "ajq_"))

    @q.handler("crawl")
    async def crawl(ctx: JobContext, site: str) -> dict[str, Any]:
        pages = SITES[site]  # discovered at run time
        async with ctx.batch() as b:
            box = b.container(f"pages of {site}", group=site)
            for path in pages:
                b.add("fetch", {"site": site, "path": path}, parent=box, group=site)
            summary = b.add("summarise", {"site": site}, group=site, depends_on=[box])
        return {"pages": len(pages), "container": box.id, "summary": summary.id}

    @q.handler("fetch", max_attempts=3)
    async def fetch(ctx: JobContext, site: str, path: str) -> dict[str, Any]:
        await asyncio.sleep(0.05)
        return {"url": f"https://{site}{path}", "words": 100 + 10 * len(path)}

    @q.handler("summarise")
    async def summarise(ctx: JobContext, site: str) -> dict[str, Any]:
        # Depending on a container means waiting for all of it; read the pages back:
        from aiojobqueue import admin

        (box_id,) = (await ctx.dependency_results()).keys()
        pages = await admin.list_jobs(ctx.queue, parent=box_id, limit=1000)
        return {"site": site, "pages": len(pages),
                "words": sum(p.result["words"] for p in pages)}

    return q


async def main() -> int:
    url = os.environ.get("AIOJOBQUEUE_URL")
    tmp = None
    if url is None:
        tmp = tempfile.TemporaryDirectory()
        url = f"sqlite+aiosqlite:///{tmp.name}/dynamic.db"
    q = make_queue(url)
    async with q:
        crawls = {site: await q.enqueue("crawl", {"site": site}) for site in SITES}
        await q.run_until_idle()  # runs the crawls, then what they added, until nothing is left
        for site, jid in crawls.items():
            planned = await q.wait(jid, timeout=10)
            summary = await q.wait(planned["summary"], timeout=10)
            print(f"{site}: {summary['pages']} pages, {summary['words']} words "
                  f"(crawl #{jid} added container #{planned['container']} "
                  f"and summary #{planned['summary']})")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

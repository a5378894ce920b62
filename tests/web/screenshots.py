"""Make docs/dashboard-overview.png and docs/dashboard-dag.png (not a test).

    PYTHONPATH=. python tests/web/screenshots.py

A demo queue on a temporary SQLite file: three tenants with weights, a site-build DAG with
containers, some failures, jobs running on a worker in this process, and an hour of
finished jobs (their finish times spread back over the hour, so the chart has a history).
The dashboard runs in a process of its own and Debian's chromium takes the pictures.
"""

from __future__ import annotations

import asyncio
import random
import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

from browser import ARGS, chromium, served
from sqlalchemy import select, update

from aiojobqueue import JobQueue, RateLimit
from aiojobqueue.schema import build_tables

DOCS = Path(__file__).resolve().parents[2] / "docs"
PREFIX = "ajq_"


async def history(url: str) -> None:
    """An hour of quick jobs: run them, then spread their finish times over the hour."""
    q = JobQueue(url, prefix=PREFIX, capacity=20)

    @q.handler("thumbnail")
    async def thumbnail(ctx: Any, n: int) -> int:
        if n % 7 == 3:
            raise OSError(f"image {n}: upstream returned 503")
        return n

    async with q:
        async with q.batch() as b:
            for i in range(700):
                b.add("thumbnail", {"n": i}, max_attempts=1,
                      group=random.choice(["acme", "globex", "initech"]))
        await q.run_until_idle()
        t = build_tables(PREFIX).jobs
        rng = random.Random(7)
        async with q.engine.begin() as conn:
            rows = (await conn.execute(select(t.c.id, t.c.finished_at))).all()
            for jid, fin in rows:
                ago = timedelta(seconds=rng.triangular(0, 3600, 600))
                await conn.execute(update(t).where(t.c.id == jid).values(
                    finished_at=fin - ago, created_at=fin - ago, started_at=fin - ago))


async def build(q: JobQueue, hold: asyncio.Event) -> int:
    @q.handler("render")
    async def render(ctx: Any, page: int) -> dict[str, int]:
        await hold.wait()
        return {"page": page}

    # the DAG: a site build with a container per section
    async with q.batch() as b:
        site = b.container("build-site", group="acme", weight=3)
        crawl = b.add("crawl", {"root": "https://example.org"}, parent=site, group="acme")
        sections = []
        for name in ("blog", "docs", "shop"):
            sec = b.container(f"section-{name}", parent=site, group="acme",
                              depends_on=[crawl])
            pages = [b.add("render", {"page": k}, parent=sec, group="acme")
                     for k in range(3 if name != "docs" else 4)]
            b.add("sitemap", {"section": name}, parent=sec, group="acme", depends_on=pages)
            sections.append(sec)
        index = b.add("search-index", {}, parent=site, group="acme", depends_on=sections[:2])
        report = b.add("report", {"to": "ops@example.org"}, depends_on=[site], group="acme")
        b.add("notify", {}, depends_on=[report, index], group="acme")
    # backlog for the fair share: three tenants with different weights
    async with q.batch() as b:
        for i in range(40):
            b.add("render", {"page": 100 + i}, group="globex", weight=2)
        for i in range(25):
            b.add("render", {"page": 200 + i}, group="initech", weight=1)
        for i in range(6):
            b.add("render", {"page": 300 + i}, group="acme", weight=3,
                  run_after=timedelta(minutes=10 + i))
    return int(report.id)


async def main() -> None:
    exe = chromium()
    from playwright.async_api import async_playwright

    tmp = Path(tempfile.mkdtemp())
    url = f"sqlite+aiosqlite:///{tmp}/demo.db"
    hold = asyncio.Event()
    await history(url)
    q = JobQueue(url, prefix=PREFIX, concurrency=8, limits=[RateLimit(120, per=60.0)],
                 group_limits={"initech": 2}, capacity=8)
    async with q:
        # crawl must finish for the sections to run: give it a handler
        @q.handler("crawl")
        async def crawl(ctx: Any, root: str) -> list[str]:
            return [root]

        report = await build(q, hold)
        worker = asyncio.create_task(q.serve())
        await asyncio.sleep(3)  # crawl done, renders running on the worker
        async with served(url, PREFIX) as base, async_playwright() as p:
            browser = await p.chromium.launch(executable_path=exe, args=ARGS, headless=True)
            page = await browser.new_page(viewport={"width": 1360, "height": 900},
                                          device_scale_factor=1)
            await page.goto(base + "/")
            await page.wait_for_selector("#live.on")
            await page.screenshot(path=str(DOCS / "dashboard-overview.png"), full_page=True)
            await page.goto(f"{base}/jobs/{report}/dag")
            await page.wait_for_selector("svg.dag")
            await page.screenshot(path=str(DOCS / "dashboard-dag.png"), full_page=True)
            await browser.close()
        hold.set()
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
    print("wrote", DOCS / "dashboard-overview.png", DOCS / "dashboard-dag.png", file=sys.stderr)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    asyncio.run(main())

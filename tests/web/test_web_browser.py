"""The dashboard as a user sees it: headless Chromium (Debian's, driven by Playwright)
against a dashboard process, on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import pytest_asyncio
from browser import ARGS, chromium, served
from webkit import failing_queue, small_dag

from aiojobqueue import JobQueue

pytestmark = pytest.mark.slow


@pytest_asyncio.fixture
async def page() -> AsyncIterator[Any]:
    """A fresh page that records console errors and uncaught exceptions."""
    exe = chromium()
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=exe, args=ARGS, headless=True)
        try:
            ctx = await browser.new_context(viewport={"width": 1400, "height": 900})
            pg = await ctx.new_page()
            pg.errors = []
            pg.on("console", lambda m: m.type == "error" and pg.errors.append(m.text))
            pg.on("pageerror", lambda e: pg.errors.append(str(e)))
            yield pg
        finally:
            await browser.close()


async def test_pages_render_without_console_errors(
        make_queue: Callable[..., JobQueue], db_url: str, prefix: str, page: Any) -> None:
    q = await failing_queue(make_queue)
    dag = await small_dag(q)
    async with served(db_url, prefix) as base:
        for path in ["/", "/jobs", f"/jobs/{dag.boom}", f"/jobs/{dag.report}/dag",
                     "/workers", "/schedules", "/jobs?state=failed"]:
            resp = await page.goto(base + path)
            assert resp.status == 200, path
            await page.wait_for_selector("#live.on")  # the live channel connected
        assert page.errors == []
    await q.close()


async def test_the_dag_is_drawn(make_queue: Callable[..., JobQueue], db_url: str,
                                prefix: str, page: Any) -> None:
    q = await failing_queue(make_queue)
    dag = await small_dag(q)
    async with served(db_url, prefix) as base:
        await page.goto(f"{base}/jobs/{dag.report}/dag")
        svg = page.locator("svg.dag")
        await svg.wait_for()
        box = await svg.bounding_box()
        assert box["width"] > 300 and box["height"] > 60
        # the container is a box, its two children inside it, the report outside
        c = await page.locator(f'g.container[data-id="{dag.site}"] > rect').bounding_box()
        for child in (dag.fetch, dag.parse):
            n = await page.locator(f'a.node[data-id="{child}"] rect').bounding_box()
            assert c["x"] < n["x"] and n["x"] + n["width"] < c["x"] + c["width"]
            assert c["y"] < n["y"] and n["y"] + n["height"] < c["y"] + c["height"]
        r = await page.locator(f'a.node[data-id="{dag.report}"] rect').bounding_box()
        assert r["x"] > c["x"] + c["width"]  # after what it waits for
        assert await page.locator(
            f'path.edge[data-from="{dag.fetch}"][data-to="{dag.parse}"]').count() == 1
        assert await page.locator(
            f'path.edge[data-from="{dag.site}"][data-to="{dag.report}"]').count() == 1
        # the report waits: the path blocking it is highlighted (through the container)
        assert await page.locator("path.edge.hot").count() >= 1
        assert await page.locator(f'a.node.hot[data-id="{dag.fetch}"]').count() == 1
        # colours by state: a ready node is drawn in the ready colour
        fill = await page.locator(f'a.node[data-id="{dag.fetch}"] rect').evaluate(
            "e => getComputedStyle(e).fill")
        assert fill == "rgb(77, 171, 247)"
        # clicking a node opens that job's DAG
        await page.locator(f'a.node[data-id="{dag.fetch}"]').click()
        await page.wait_for_url(f"**/jobs/{dag.fetch}/dag")
        assert page.errors == []
    await q.close()


async def test_a_retry_click_changes_the_job(make_queue: Callable[..., JobQueue], db_url: str,
                                             prefix: str, page: Any) -> None:
    q = await failing_queue(make_queue)
    dag = await small_dag(q)
    async with served(db_url, prefix) as base:
        await page.goto(f"{base}/jobs/{dag.boom}")
        assert await page.locator("#job-state").inner_text() == "failed"
        await page.click("#retry")
        await page.wait_for_url(f"**/jobs/{dag.boom}")
        assert (await q.get(dag.boom)).state in ("ready", "scheduled")
        assert await page.locator("#job-state").inner_text() in ("ready", "scheduled")
        assert await page.locator("#retry").count() == 0  # not failed any more
        assert page.errors == []
    await q.close()


async def test_a_bulk_cancel_asks_first(make_queue: Callable[..., JobQueue], db_url: str,
                                        prefix: str, page: Any) -> None:
    q = make_queue()
    async with q:
        doomed = [await q.enqueue("t", {}, group="doomed") for _ in range(4)]
        kept = await q.enqueue("t", {}, group="kept")
        async with served(db_url, prefix) as base:
            await page.goto(f"{base}/jobs?group=doomed")
            await page.click('button[data-bulk="cancel"]')
            await page.wait_for_selector("#confirm")
            assert "Cancel 4 jobs?" in await page.locator("h1").inner_text()
            assert [(await q.get(j)).state for j in doomed] == ["ready"] * 4  # only asked
            await page.click("#confirm")
            await page.wait_for_selector("text=4 jobs cancelled")
            assert [(await q.get(j)).state for j in doomed] == ["cancelled"] * 4
            assert (await q.get(kept)).state == "ready"
            assert page.errors == []


async def test_a_page_updates_live_when_a_worker_finishes_a_job(
        make_queue: Callable[..., JobQueue], db_url: str, prefix: str, page: Any) -> None:
    from conftest import eventually
    from playwright.async_api import expect

    # a browser and a second process share 2 cores here: leases must outlive a slow beat
    q = make_queue(lease_ttl=30.0, heartbeat_interval=1.0)
    release = asyncio.Event()

    @q.handler("hold")
    async def hold(ctx: Any) -> str:
        await release.wait()
        return "finished"

    async with q:
        jid = await q.enqueue("hold", {})
        worker = asyncio.create_task(q.serve())
        try:
            async def running() -> bool:
                return (await q.get(jid)).state == "running"

            await eventually(running)
            async with served(db_url, prefix) as base:
                await page.goto(f"{base}/jobs/{jid}")
                await page.wait_for_selector("#live.on")
                assert await page.locator("#job-state").inner_text() == "running"
                await page.evaluate("window.notReloaded = true")
                release.set()
                await expect(page.locator("#job-state")).to_have_text("done", timeout=15_000)
                assert await page.evaluate("window.notReloaded") is True  # no reload
                assert "finished" in await page.locator("main").inner_text()  # the result
                assert page.errors == []
        finally:
            release.set()
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)


async def test_server_sent_events_announce_changes(make_queue: Callable[..., JobQueue],
                                                   db_url: str, prefix: str) -> None:
    """The event stream itself, as a non-browser client reads it."""
    q = make_queue()
    async with q, served(db_url, prefix) as base, httpx.AsyncClient(timeout=20) as c, c.stream(
            "GET", base + "/events") as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events: list[str] = []

        async def read() -> None:
            async for line in resp.aiter_lines():
                if line.startswith("event:"):
                    events.append(line.split(":", 1)[1].strip())
                    if events[-1] == "change":
                        return

        reader = asyncio.create_task(read())
        from conftest import eventually

        await eventually(lambda: "hello" in events)
        await q.enqueue("t", {})
        await asyncio.wait_for(reader, 15)
        assert events[:1] == ["hello"] and events[-1] == "change"

"""The dashboard's schedules page: pause, resume and run-now buttons in Chromium, and the
same actions refused to read-only access and to other sites, on all three databases."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from browser import ARGS, chromium, served
from sqlalchemy import func, select
from webkit import client

from aiojobqueue import JobQueue

PARIS = "Europe/Paris"


@pytest_asyncio.fixture
async def page() -> AsyncIterator[Any]:
    """A fresh Chromium page that records console errors and uncaught exceptions."""
    exe = chromium()
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=exe, args=ARGS, headless=True)
        try:
            pg = await (await browser.new_context(viewport={"width": 1400, "height": 900})
                        ).new_page()
            pg.errors = []
            pg.on("console", lambda m: m.type == "error" and pg.errors.append(m.text))
            pg.on("pageerror", lambda e: pg.errors.append(str(e)))
            yield pg
        finally:
            await browser.close()


async def paused(q: JobQueue, name: str) -> bool:
    return {s.name: s.paused for s in await q.schedules()}[name]


@pytest.mark.slow
async def test_the_buttons_pause_resume_and_run_a_schedule(
        make_queue: Callable[..., JobQueue], db_url: str, prefix: str, page: Any) -> None:
    q = make_queue()
    q.periodic("nightly", type="report", cron="0 3 * * *", tz=PARIS, args={"full": True})
    async with q, served(db_url, prefix) as base:
        await page.goto(f"{base}/schedules")
        row = page.locator("#schedule-nightly")
        assert PARIS in await row.inner_text() and "cron 0 3 * * *" in await row.inner_text()
        assert await row.locator("td.paused").inner_text() == "active"
        page.once("dialog", lambda d: d.accept())  # "Pause schedule nightly ...?"
        await row.locator('button[name="pause"]').click()
        await page.wait_for_selector("#schedule-nightly td.paused >> text=paused")
        assert await paused(q, "nightly")
        await page.locator('#schedule-nightly button[name="resume"]').click()
        await page.wait_for_selector("#schedule-nightly td.paused >> text=active")
        assert not await paused(q, "nightly")
        await page.locator('#schedule-nightly button[name="trigger"]').click()
        await page.wait_for_url("**/jobs/*")
        job_id = int(page.url.rsplit("/", 1)[1])
        job = await q.get(job_id)
        assert job.type == "report" and job.args == {"full": True}
        assert job.key is not None and job.key.startswith("cron:nightly:now:")
        assert page.errors == []


async def test_schedule_actions_need_full_access_from_the_same_site(
        make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()
    q.periodic("nightly", type="report", cron="0 3 * * *", tz=PARIS)
    async with q:
        J = q._t.jobs
        async with client(q, "read") as c:
            page = await c.get("/schedules")
            assert page.status_code == 200 and 'name="pause"' not in page.text
            r = await c.post("/schedules/pause", data={"name": "nightly"})
            assert r.status_code == 403
        async with client(q) as c:
            assert 'name="pause"' in (await c.get("/schedules")).text
            for action in ("pause", "trigger"):
                r = await c.post(f"/schedules/{action}", data={"name": "nightly"},
                                 headers={"sec-fetch-site": "cross-site"})
                assert r.status_code == 403
                r = await c.post(f"/schedules/{action}", data={"name": "nightly"},
                                 headers={"origin": "https://evil.example"})
                assert r.status_code == 403
            assert (await c.post("/schedules/pause", data={"name": "nope"})).status_code == 404
            assert (await c.post("/schedules/explode", data={"name": "nightly"})
                    ).status_code == 404
            assert not await paused(q, "nightly")
            assert await q._read(lambda conn: conn.scalar(select(func.count()).select_from(J))) == 0
            r = await c.post("/schedules/pause", data={"name": "nightly"},
                             headers={"sec-fetch-site": "same-origin"})
            assert r.status_code == 303 and await paused(q, "nightly")
            api = (await c.get("/api/schedules")).json()
            assert api[0]["name"] == "nightly" and api[0]["paused"] is True
            assert api[0]["tz"] == PARIS

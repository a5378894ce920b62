"""The job page (issue 33 item 8): one snapshot per page, times in the reader's words, the
wording of its headings and attempts, and live workers that do not look dead."""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from browser import ARGS, chromium, served
from conftest import eventually
from webkit import client

from aiojobqueue import JobContext, JobQueue

BADGE = re.compile(r'<span id="job-state"><span class="state s-(\w+)"')
WHY = re.compile(r'<p id="why-text">(.*?)</p>', re.S)
ATTEMPTS = re.compile(r'<dd class="num" id="attempts" data-attempts="(\d+)" data-limit="(\d+)"')


def text_of(markup: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


def page_facts(page: str) -> tuple[str, str, int, int]:
    """(badge state, the explanation's words, attempts, limit) of a job page."""
    badge, why, attempts = BADGE.search(page), WHY.search(page), ATTEMPTS.search(page)
    assert badge and why and attempts, page[:3000]
    return badge[1], text_of(why[1]), int(attempts[1]), int(attempts[2])


async def test_badge_text_and_facts_are_one_moment(make_queue: Callable[..., JobQueue]) -> None:
    """A job that fails and is retried every few milliseconds, its page read 60 times while
    it changes: the badge, the sentence and the attempts always tell the same moment."""
    q = make_queue(retry_backoff=0.005, retry_backoff_max=0.01, poll_interval=0.01)

    @q.handler("flaky", max_attempts=100_000)
    async def flaky(ctx: JobContext) -> None:
        raise OSError("still flaky")

    async with q:
        jid = await q.enqueue("flaky", {})
        task = asyncio.create_task(q.serve())
        seen: set[str] = set()
        try:
            async with client(q) as c:
                for _ in range(60):
                    state, why, attempts, limit = page_facts((await c.get(f"/jobs/{jid}")).text)
                    seen.add(state)
                    assert f"is {state}." in why, (state, why)
                    failed = re.search(r"Attempt (\d+) failed", why)
                    if failed:  # in backoff: the attempt the sentence names is the count
                        assert int(failed[1]) == attempts, (why, attempts)
                    running = re.search(r"running attempt (\d+)", why)
                    if running:
                        assert int(running[1]) == attempts, (why, attempts)
                    assert limit == 100_000
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert "scheduled" in seen  # the page did catch the job between attempts


async def test_times_are_in_words_and_headings_read_right(
        make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()

    @q.handler("boom", max_attempts=2)
    async def boom(ctx: JobContext) -> None:
        raise ValueError("no flux")

    async with q:
        jid = await q.enqueue("boom", {})
        await q.run_until_idle()
        async with client(q) as c:
            page = (await c.get(f"/jobs/{jid}")).text
            state, _why, attempts, limit = page_facts(page)
            assert (state, attempts, limit) == ("failed", 2, 2)
            assert "How it ended" in page and "Why it is failed" not in page
            assert "per round" not in page and "since the manual retry" not in page
            visible = text_of(page.split('<section class="card facts">')[1].split("</section>")[0])
            assert re.search(r"created\s*(just now|\d+ s ago)", visible), visible
            assert not re.search(r"\d{4}-\d\d-\d\d", visible), visible  # no raw timestamps
            assert re.search(r'<time datetime="[^"]+" title="[^"]+ UTC">', page)
            # the failed attempts' times too
            history = page.split('<section class="card history">')[1].split("</section>")[0]
            assert "<time datetime=" in history and not re.search(
                r"\d\d:\d\d:\d\d", text_of(history))
            r = await c.post(f"/jobs/{jid}/retry", headers={"Sec-Fetch-Site": "same-origin"})
            assert r.status_code in (200, 303), r.text
            page = (await c.get(f"/jobs/{jid}")).text
            state, _why, attempts, limit = page_facts(page)
            assert state in ("ready", "scheduled") and (attempts, limit) == (2, 4)
            assert "2 runs, 2 failed; attempt 0 of 2 since the manual retry" in page
            assert "Why it is not running yet" in page


@pytest_asyncio.fixture
async def page() -> AsyncIterator[Any]:
    exe = chromium()
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=exe, args=ARGS, headless=True)
        try:
            ctx = await browser.new_context(viewport={"width": 1400, "height": 900},
                                            timezone_id="Asia/Tokyo", locale="en-GB")
            yield await ctx.new_page()
        finally:
            await browser.close()


@pytest.mark.slow
async def test_in_the_browser_times_hover_local_and_live_workers_are_not_grey(
        make_queue: Callable[..., JobQueue], db_url: str, prefix: str, page: Any) -> None:
    release = asyncio.Event()
    q = make_queue()

    @q.handler("hold")
    async def hold(ctx: JobContext) -> None:
        await release.wait()

    async with q:
        jid = await q.enqueue("hold", {})
        task = asyncio.create_task(q.serve())
        try:
            async def running() -> bool:
                return (await q.get(jid)).state == "running"

            await eventually(running)
            async with served(db_url, prefix) as base:
                await page.goto(f"{base}/jobs/{jid}")
                created = page.locator("dl time").first
                title = await created.get_attribute("title")
                iso = await created.get_attribute("datetime")
                local = await page.evaluate("(s) => new Date(s).toLocaleString()", iso)
                assert title == local and "UTC" not in title  # JST, from the page's script
                await page.goto(f"{base}/workers")
                row = page.locator("tr.worker-live td").first
                color = await row.evaluate("(e) => getComputedStyle(e).color")
                ink = await page.evaluate("getComputedStyle(document.body).color")
                assert color == ink, (color, ink)  # not the header badge's pale grey
        finally:
            release.set()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

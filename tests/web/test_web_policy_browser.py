"""The stored policy on the overview as a user sees it: headless Chromium (Debian's, via
Playwright) against ``aiojobqueue dashboard --url`` (the standalone server, which has no
settings of its own), on SQLite, PostgreSQL and MariaDB: edit a group's cap, pause a group,
clear the global cap, and see each change on the page and in the database."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from browser import ARGS, ROOT, chromium, free_port

from aiojobqueue import JobQueue

pytestmark = pytest.mark.slow
SHOTS = Path(os.environ.get("AJQ_SCREENSHOTS", "")) if os.environ.get("AJQ_SCREENSHOTS") \
    else None


@asynccontextmanager
async def standalone(url: str, prefix: str, *extra: str) -> AsyncIterator[str]:
    """``python -m aiojobqueue dashboard`` on a free port; yields its base URL."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(  # noqa: ASYNC220 (returns at once; the wait below polls)
        [sys.executable, "-m", "aiojobqueue", "dashboard", "--url", url, "--prefix", prefix,
         "--port", str(port), *extra], env=env, stdout=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        async with httpx.AsyncClient(timeout=2) as c:
            while True:
                assert proc.poll() is None, f"the dashboard exited ({proc.returncode})"
                try:
                    if (await c.get(base + "/")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "the dashboard did not answer in 30 s"
                await asyncio.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        for _ in range(100):
            if proc.poll() is not None:
                break
            await asyncio.sleep(0.1)
        else:
            proc.kill()
            proc.wait()


@pytest_asyncio.fixture
async def page() -> AsyncIterator[Any]:
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


async def test_edit_a_cap_and_pause_a_group_on_the_overview(
        make_queue: Callable[..., JobQueue], db_url: str, prefix: str, db: str,
        page: Any) -> None:
    q = make_queue()
    async with q:
        for g, n in (("tenant-a", 4), ("tenant-b", 3)):
            for _ in range(n):
                await q.enqueue("t", {}, group=g)
        await q.set_policy(concurrency=4)
        await q.set_group("*", cap=3)
        async with standalone(db_url, prefix) as base:
            await page.goto(base + "/")
            await page.wait_for_selector("#live.on")
            # what is stored, and nothing that contradicts it
            assert await page.locator("#pol-concurrency").inner_text() == "4"
            main = await page.locator("main").inner_text()
            assert "no global cap" not in main and "FAIR-SHARE TARGET" in main.upper()
            a = page.locator('tr[data-group="tenant-a"]')
            assert await a.locator('input[name="cap"]').get_attribute("placeholder") == "3"

            # edit tenant-a's cap
            await a.locator('input[name="cap"]').fill("2")
            async with page.expect_navigation():
                await a.locator('button[data-save="tenant-a"]').click()
            assert (await q.policy()).group("tenant-a").cap == 2
            a = page.locator('tr[data-group="tenant-a"]')
            assert await a.locator('input[name="cap"]').input_value() == "2"
            assert "tenant-a" in await page.locator("#group-rows").inner_text()

            # pause tenant-b
            async with page.expect_navigation():
                await page.click('button[data-pause="tenant-b"]')
            assert (await q.policy()).group("tenant-b").paused
            b = page.locator('tr[data-group="tenant-b"]')
            await b.locator(".group-paused").wait_for()
            assert await b.locator('button[data-resume="tenant-b"]').count() == 1
            if SHOTS is not None:
                await page.screenshot(path=str(SHOTS / f"policy-overview-{db}.png"),
                                      full_page=True)

            # clear the global cap: the gauge and the targets say so
            await page.fill('#policy-form input[name="concurrency"]', "")
            async with page.expect_navigation():
                await page.click('#policy-form button[type="submit"]')
            assert (await q.policy()).concurrency is None
            assert await page.locator("#pol-concurrency").inner_text() == "none"
            main = await page.locator("main").inner_text()
            assert "FAIR-SHARE TARGET" not in main.upper()
            assert "no global cap is set" in main
            assert page.errors == []

        # read access: the same facts, no form
        async with standalone(db_url, prefix, "--read-only") as base:
            await page.goto(base + "/")
            assert await page.locator("#pol-concurrency").inner_text() == "none"
            assert await page.locator("form").count() == 0
            b = page.locator('tr[data-group="tenant-b"]')
            assert await b.locator(".group-paused").count() == 1

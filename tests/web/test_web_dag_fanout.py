"""Wide fan-outs on the DAG page, in Chromium: 10, 100 and 1,000 children between a head and
a fan-in, inside a container. Read from the live SVG: no edge passes through a box; a wide
layer is one counted group whose link draws every child, still with no edge through a box.
Screenshots of each land in the test's directory (and in $AJQ_SCREENSHOTS if set)."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from browser import ARGS, chromium, served
from dagcheck import READ_SVG, Rect, crossings, points

from aiojobqueue import JobQueue
from aiojobqueue.web import dag as D

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


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
            pg.on("pageerror", lambda e: pg.errors.append(str(e)))
            yield pg
        finally:
            await browser.close()


async def fan_out(q: JobQueue, n: int) -> tuple[int, int]:
    """A container holding a head, ``n`` children depending on it and a fan-in depending on
    them all. Returns (container, fan-in) ids."""
    async with q.batch() as b:
        box = b.container("fan")
        head = b.add("split", {}, parent=box)
        kids = [b.add("work", {"i": i}, parent=box, depends_on=[head]) for i in range(n)]
        fin = b.add("merge", {}, parent=box, depends_on=kids)
    assert box.id is not None and fin.id is not None
    return box.id, fin.id


async def geometry(page: Any) -> tuple[list[Rect], list[tuple[str, str, list[Any]]]]:
    got = await page.evaluate(READ_SVG)
    rects = [Rect(r["id"], r["x"], r["y"], r["w"], r["h"]) for r in got["rects"]]
    edges = [(e["a"], e["b"], points(e["d"])) for e in got["edges"]]
    return rects, edges


def keep(shot: Path) -> None:
    out = os.environ.get("AJQ_SCREENSHOTS")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(out) / shot.name)


@pytest.mark.parametrize("db", ["sqlite", "postgresql", "mariadb"])
@pytest.mark.parametrize("n", [10, 100, 1000])
async def test_fan_outs_are_drawn_with_no_edge_through_a_box(
        n: int, make_queue: Callable[..., JobQueue], db_url: str, prefix: str,
        page: Any, tmp_path: Path, db: str) -> None:
    q = make_queue()
    await q.start()
    _box, fin = await fan_out(q, n)
    async with served(db_url, prefix) as base:
        await page.goto(f"{base}/jobs/{fin}/dag")
        rects, edges = await geometry(page)
        assert edges and crossings(edges, rects) == []
        shot = tmp_path / f"dag-fanout-{n}-{db}.png"
        await page.locator(".dag-wrap").screenshot(path=str(shot))
        keep(shot)
        nodes = await page.locator("svg.dag a.node").count()
        groups = page.locator("svg.dag .group, svg.dag .summary")
        if n <= D.FAN_MAX:
            assert nodes == n + 2 and await groups.count() == 0  # with the head and fan-in
            assert await page.locator("svg.dag path.edge").count() == 2 * n
            return
        # collapsed: FAN_KEEP children and one group counting the rest, linked to all
        assert nodes == D.FAN_KEEP + 2
        assert await groups.count() == 1
        assert int(await groups.first.get_attribute("data-count")) == n - D.FAN_KEEP
        assert "Show all" in await page.locator("p.note").first.inner_text()
        await groups.first.click()
        await page.wait_for_url("**expand=all")
        rects, edges = await geometry(page)
        assert crossings(edges, rects) == []
        assert await page.locator("svg.dag a.node").count() == n + 2
        assert await page.locator("svg.dag .group, svg.dag .summary").count() == 0
        shot = tmp_path / f"dag-fanout-{n}-{db}-all.png"
        await page.screenshot(path=str(shot))
        keep(shot)
    assert page.errors == []
    await q.close()

"""Live updates: one watcher per dashboard, at most one marker read per interval however many
pages listen, and every listener hears a change. On all three databases."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiojobqueue import JobQueue
from aiojobqueue.web.data import Data
from aiojobqueue.web.live import Hub


async def test_one_watcher_reads_at_most_once_a_second(
        make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()
    async with q:
        hub = Hub(Data(q), interval=1.0)
        async with contextlib_all(hub, 25) as boxes:
            assert hub.subscribers == 25
            loop = asyncio.get_running_loop()
            start, reads0 = loop.time(), hub.reads
            for _ in range(35):  # a commit every 0.1 s: each one wakes the watcher
                await q.enqueue("t", {})
                await asyncio.sleep(0.1)
            elapsed, reads = loop.time() - start, hub.reads - reads0
            # 25 open pages, a busy database, one reader: at most one read per second
            assert 1 <= reads <= elapsed + 1, (reads, elapsed)
            await asyncio.sleep(1.5)  # the last of those changes published
            for b in boxes:
                while not b.empty():
                    b.get_nowait()
            # a new change reaches every page
            before = hub.version
            await q.enqueue("t", {})
            got = await asyncio.wait_for(asyncio.gather(*(b.get() for b in boxes)), 20)
            assert len(got) == 25 and all(v > before for v in got)
        # nobody listens: the watcher stops, nothing reads the database
        assert hub.subscribers == 0
        idle = hub.reads
        await asyncio.sleep(1.5)
        assert hub.reads == idle


async def test_finishing_claiming_and_retrying_are_changes(
        make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()

    @q.handler("boom", max_attempts=1)
    async def boom(ctx: Any) -> None:
        raise ValueError("x")

    async with q:
        jid = await q.enqueue("boom", {})
        data = Data(q)
        seen = [await data.marker()]
        await q.run_until_idle()  # claimed and failed
        seen.append(await data.marker())
        await q.retry(jid)
        seen.append(await data.marker())
        # each step shows (the watcher compares each read with the one before)
        assert seen[0] != seen[1] and seen[1] != seen[2], seen


async def test_a_finish_shows_within_the_interval_where_no_listener_hears_it(
        make_queue: Callable[..., JobQueue]) -> None:
    """A job finishing (nothing released) sends no wake-up on PostgreSQL or MySQL/MariaDB:
    the page still sees it within the polling interval, not the push backstop."""
    q = make_queue()

    @q.handler("ok")
    async def ok(ctx: Any) -> None:
        return None

    async with q:
        await q.enqueue("ok", {})
        hub = Hub(Data(q), interval=0.5, push_backstop=60.0)
        async with hub.subscribe() as box:
            await q.run_until_idle()
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            await asyncio.wait_for(box.get(), 10)
            assert loop.time() - t0 < 5.0


class contextlib_all:
    """``n`` subscriptions of one hub, entered and left together."""

    def __init__(self, hub: Hub, n: int) -> None:
        self.cms = [hub.subscribe() for _ in range(n)]

    async def __aenter__(self) -> list[asyncio.Queue[int]]:
        return [await cm.__aenter__() for cm in self.cms]

    async def __aexit__(self, *exc: Any) -> None:
        for cm in self.cms:
            await cm.__aexit__(None, None, None)

"""Helpers of the dashboard tests: an httpx client on the ASGI app, and a small DAG."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from aiojobqueue import JobQueue
from aiojobqueue.web import dashboard

SAME = {"Sec-Fetch-Site": "same-origin"}


def client(queue: JobQueue, level: str | None = "full", **kw: Any) -> httpx.AsyncClient:
    """A client of ``dashboard(queue)`` whose every request gets ``level`` access."""
    app = dashboard(queue, access=lambda request: level, **kw)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dash")


@dataclass
class Dag:
    site: int
    fetch: int
    parse: int
    report: int
    boom: int
    lone: int


async def failing_queue(make_queue: Callable[..., JobQueue], **kw: Any) -> JobQueue:
    """A started queue with a ``boom`` handler that always fails."""
    q = make_queue(**kw)

    @q.handler("boom", max_attempts=1)
    async def boom(ctx: Any) -> None:
        raise ValueError("the flux capacitor is out of flux")

    await q.start()
    return q


async def small_dag(q: JobQueue) -> Dag:
    """A container of two chained jobs, a job waiting on the container, and a failed job
    (the queue needs the ``boom`` handler). The other types have no handler here: they stay
    ready or waiting."""
    async with q.batch() as b:
        site = b.container("build-site", group="tenant-a", weight=3)
        a = b.add("fetch", {"url": "https://example.org"}, parent=site, group="tenant-a")
        p = b.add("parse", {"n": 1}, parent=site, depends_on=[a], group="tenant-a")
        r = b.add("report", {}, depends_on=[site], group="tenant-b")
    boom = await q.enqueue("boom", {}, group="tenant-b")
    await q.run_until_idle()
    lone = await q.enqueue("lone", {"x": 1}, group="tenant-c")
    return Dag(site.id, a.id, p.id, r.id, boom, lone)

"""``aiojobqueue dashboard``'s implementation: serve.run on a real port, on every database."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable

import httpx
from browser import free_port

from aiojobqueue import JobQueue
from aiojobqueue.web import serve


def test_binds_localhost_by_default() -> None:
    for fn in (serve.serve, serve.run):
        params = inspect.signature(fn).parameters
        assert params["host"].default == "127.0.0.1"
        assert params["read_only"].default is False


async def test_read_only_server_shows_pages_and_refuses_actions(
        make_queue: Callable[..., JobQueue], db_url: str, prefix: str) -> None:
    q = make_queue()
    async with q:
        jid = await q.enqueue("t", {})
        port = free_port()
        task = asyncio.create_task(serve.run(db_url, port=port, read_only=True, prefix=prefix))
        base = f"http://127.0.0.1:{port}"
        try:
            async with httpx.AsyncClient(timeout=5) as c:
                for _ in range(200):
                    try:
                        r = await c.get(base + f"/jobs/{jid}")
                        break
                    except httpx.TransportError:
                        assert not task.done(), task
                        await asyncio.sleep(0.05)
                assert r.status_code == 200 and "read-only" in r.text
                r = await c.post(base + f"/jobs/{jid}/cancel",
                                 headers={"Sec-Fetch-Site": "same-origin"})
                assert r.status_code == 403
            assert (await q.get(jid)).state == "ready"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

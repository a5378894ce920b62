"""``aiojobqueue dashboard``: the dashboard served alone by uvicorn.

It binds 127.0.0.1 unless told otherwise: the standalone server has no login of its own,
so anyone who can reach the port has the access it was started with (``--read-only``:
pages only, every action refused).
"""

from __future__ import annotations

import asyncio

from ..queue import JobQueue
from ..schema import DEFAULT_PREFIX
from .app import dashboard


def serve(url: str, host: str = "127.0.0.1", port: int = 8000, read_only: bool = False,
          prefix: str = DEFAULT_PREFIX) -> None:
    """Serve the dashboard of the queue at ``url`` until interrupted (Ctrl-C). The schema
    must exist (it creates and changes nothing but what its actions do)."""
    asyncio.run(run(url, host, port, read_only, prefix))


async def run(url: str, host: str = "127.0.0.1", port: int = 8000, read_only: bool = False,
              prefix: str = DEFAULT_PREFIX) -> None:
    """``serve`` inside a running event loop."""
    import uvicorn

    level = "read" if read_only else "full"
    queue = JobQueue(url, prefix=prefix)
    await queue.start(migrate=False)
    try:
        app = dashboard(queue, access=lambda request: level)
        config = uvicorn.Config(app, host=host, port=port, log_level="info",
                                lifespan="on", access_log=False)
        server = uvicorn.Server(config)
        print(f"aiojobqueue dashboard ({level} access) on http://{host}:{port}/  "
              "(Ctrl-C stops it)", flush=True)
        serving = asyncio.ensure_future(server.serve())
        try:
            await asyncio.shield(serving)
        except asyncio.CancelledError:  # stop as on Ctrl-C: connections and sockets closed
            server.should_exit = True
            await serving
            raise
    finally:
        await queue.close()

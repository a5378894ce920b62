"""Serve a dashboard in a process of its own (the browser tests): URL PREFIX PORT [LEVEL].

Like ``aiojobqueue dashboard`` but on a test prefix and port, with the test queue's caps so
the overview shows gauges."""

from __future__ import annotations

import asyncio
import sys

import uvicorn

from aiojobqueue import JobQueue, RateLimit
from aiojobqueue.web import dashboard


async def main(url: str, prefix: str, port: int, level: str) -> None:
    queue = JobQueue(url, prefix=prefix, concurrency=8, limits=[RateLimit(120, per=60.0)],
                     group_limits={"tenant-b": 3, "initech": 2})
    await queue.start(migrate=False)  # the test made the tables; a dashboard writes none
    try:
        app = dashboard(queue, access=lambda request: level)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                               log_level="warning", lifespan="on"))
        await server.serve()
    finally:
        await queue.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]),
                     sys.argv[4] if len(sys.argv) > 4 else "full"))

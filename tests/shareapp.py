"""The app of tests/crash/test_two_processes_share.py: a FastAPI service that embeds
``serve()`` in its lifespan, as examples/fastapi_app.py does, with the default ``capacity``
and a global cap of 4; ``aiojobqueue worker shareapp:queue`` runs the same handlers in a
second process. Each job returns the pid of the process that ran it."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

from aiojobqueue import JobContext, JobQueue

queue = JobQueue(os.environ["AIOJOBQUEUE_URL"], prefix=os.environ["AIOJOBQUEUE_PREFIX"],
                 concurrency=4, poll_interval=0.1)


@queue.handler("work")
async def work(ctx: JobContext, seconds: float) -> dict[str, Any]:
    await asyncio.sleep(seconds)
    return {"pid": os.getpid()}


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with queue:
        worker = asyncio.create_task(queue.serve())
        try:
            yield
        finally:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker


app = FastAPI(lifespan=lifespan)


@app.get("/healthz")
async def healthz() -> dict[str, int]:
    return {"pid": os.getpid()}

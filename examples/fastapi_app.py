"""A FastAPI app that embeds aiojobqueue: the queue lives in the app's lifespan.

Run it (SQLite file by default; any URL works):

    pip install "aiojobqueue[web]" fastapi uvicorn  # in a clone: pip install -e ".[web]" fastapi uvicorn
    AIOJOBQUEUE_URL=sqlite+aiosqlite:///app.db uvicorn examples.fastapi_app:app

    curl -X POST localhost:8000/jobs -H 'content-type: application/json' \\
         -d '{"type": "resize", "args": {"image": "cat.png", "width": 200}}'
    curl localhost:8000/jobs/1
    open http://localhost:8000/queue/             # the dashboard, mounted below
    curl -X POST localhost:8000/albums -H 'content-type: application/json' \\
         -d '{"images": ["a.png", "b.png", "c.png"]}'

This process serves HTTP *and* runs jobs. To run jobs elsewhere too, start more workers on
the same database: ``aiojobqueue worker examples.fastapi_app:queue`` (see the README).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

from aiojobqueue import InvalidJobError, JobContext, JobNotFoundError, JobQueue
from aiojobqueue.web import dashboard

queue = JobQueue(
    os.environ.get("AIOJOBQUEUE_URL", "sqlite+aiosqlite:///app.db"),
    prefix=os.environ.get("AIOJOBQUEUE_PREFIX", "ajq_"),
    concurrency=8,  # at most 8 jobs at once across every process on this database
    poll_interval=float(os.environ.get("AIOJOBQUEUE_POLL", "1.0")),
)


@queue.handler("resize", timeout=60, max_attempts=3)
async def resize(ctx: JobContext, image: str, width: int) -> dict[str, Any]:
    await asyncio.sleep(0.05)  # stand-in for real work
    return {"image": image, "width": width, "url": f"/thumbs/{width}/{image}"}


@queue.handler("zip")
async def zip_album(ctx: JobContext, name: str) -> dict[str, Any]:
    thumbs = await ctx.dependency_results()  # {resize job id: its result}
    return {"album": name, "thumbs": sorted(t["url"] for t in thumbs.values())}


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with queue:  # connects, creates/upgrades the schema
        worker = asyncio.create_task(queue.serve())
        try:
            yield
        finally:
            worker.cancel()  # graceful: running jobs get shutdown_timeout to finish
            with contextlib.suppress(asyncio.CancelledError):
                await worker


app = FastAPI(title="aiojobqueue example", lifespan=lifespan)
# The dashboard: put your own authentication in `access` ("full", "read" or None for 403).
app.mount("/queue", dashboard(queue, access=lambda request: "full"))


class NewJob(BaseModel):
    type: str
    args: dict[str, Any] = Field(default_factory=dict)
    group: str | None = None
    key: str | None = None


class NewAlbum(BaseModel):
    name: str = "album"
    images: list[str]
    width: int = 200


#: The job types HTTP clients may enqueue directly (``zip`` only makes sense inside an album).
PUBLIC_TYPES = frozenset({"resize"})


@app.post("/jobs", status_code=201)
async def enqueue(body: NewJob) -> dict[str, int]:
    if body.type not in PUBLIC_TYPES:
        raise HTTPException(400, f"unknown job type {body.type!r}")
    try:
        job_id = await queue.enqueue(body.type, body.args, group=body.group, key=body.key)
    except InvalidJobError as exc:
        raise HTTPException(400, str(exc)) from None
    return {"id": job_id}


@app.post("/albums", status_code=201)
async def album(body: NewAlbum) -> dict[str, Any]:
    """A small DAG in one transaction: one resize per image, grouped in a container (so the
    album has one state), then a zip that fans in their results."""
    async with queue.batch() as b:
        box = b.container("album", group=body.name)
        parts = [b.add("resize", {"image": img, "width": body.width}, parent=box,
                       group=body.name) for img in body.images]
        last = b.add("zip", {"name": body.name}, group=body.name, depends_on=parts)
    return {"container": box.id, "zip": last.id}


@app.get("/jobs/{job_id}")
async def job_status(job_id: int) -> dict[str, Any]:
    try:
        job = await queue.get(job_id)
    except JobNotFoundError:
        raise HTTPException(404, f"no job {job_id}") from None
    return {"id": job.id, "type": job.type, "state": job.state.value, "result": job.result,
            "error": job.error, "attempts": job.attempts, "parent_id": job.parent_id,
            "depends_on": list(job.depends_on)}


@app.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}

"""An approval step completed by a webhook: a DAG with an external step, in a FastAPI app.

``POST /orders`` enqueues ``reserve`` -> ``approval`` (an external step: no worker runs
it) -> ``ship``. The approval waits until someone (a human in a back office, a payment
provider, another service) calls ``POST /webhooks/approval/{id}``; ``ship`` then runs with
the approval's result, or is cancelled if it was refused. An approval nobody answers within
``APPROVAL_TIMEOUT`` seconds fails by itself (a worker's sweep), and ``ship`` with it.

    pip install "aiojobqueue[web]" fastapi uvicorn
    AIOJOBQUEUE_URL=sqlite+aiosqlite:///orders.db uvicorn examples.approval_webhook:app

    curl -X POST localhost:8000/orders -H 'content-type: application/json' -d '{"sku": "mug"}'
    curl -X POST localhost:8000/webhooks/approval/2 -H 'content-type: application/json' \\
         -d '{"approved": true, "by": "alice"}'
    curl localhost:8000/orders/3                      # the ship job: done
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

from aiojobqueue import InvalidStateError, JobContext, JobNotFoundError, JobQueue

queue = JobQueue(
    os.environ.get("AIOJOBQUEUE_URL", "sqlite+aiosqlite:///orders.db"),
    prefix=os.environ.get("AIOJOBQUEUE_PREFIX", "ajq_"),
    poll_interval=float(os.environ.get("AIOJOBQUEUE_POLL", "1.0")),
)
APPROVAL_TIMEOUT = float(os.environ.get("APPROVAL_TIMEOUT", "3600"))


@queue.handler("reserve")
async def reserve(ctx: JobContext, sku: str) -> dict[str, Any]:
    return {"sku": sku, "reserved": True}


@queue.handler("ship")
async def ship(ctx: JobContext, sku: str) -> dict[str, Any]:
    results = await ctx.dependency_results()  # {approval id: what the webhook sent}
    (approval,) = results.values()
    return {"sku": sku, "shipped": True, "approved_by": approval["by"]}


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with queue:
        worker = asyncio.create_task(queue.serve())  # runs jobs, and sweeps timeouts
        try:
            yield
        finally:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker


app = FastAPI(title="approval example", lifespan=lifespan)


class Order(BaseModel):
    sku: str


class Decision(BaseModel):
    approved: bool
    by: str = "someone"
    reason: str = ""


@app.post("/orders", status_code=201)
async def new_order(order: Order) -> dict[str, int]:
    async with queue.batch() as b:
        held = b.add("reserve", {"sku": order.sku})
        approval = b.external("approval", {"sku": order.sku}, depends_on=[held],
                              timeout=timedelta(seconds=APPROVAL_TIMEOUT))
        shipped = b.add("ship", {"sku": order.sku}, depends_on=[approval])
    return {"reserve": held.id, "approval": approval.id, "ship": shipped.id}


@app.post("/webhooks/approval/{job_id}")
async def decide(job_id: int, decision: Decision) -> dict[str, Any]:
    """The webhook: complete or fail the approval step. A second call (a retried webhook)
    changes nothing and answers 409, as does one for a step that timed out."""
    try:
        if decision.approved:
            await queue.complete(job_id, {"by": decision.by})
        else:
            await queue.fail(job_id, f"refused by {decision.by}: {decision.reason}")
    except JobNotFoundError:
        raise HTTPException(404, f"no job {job_id}") from None
    except InvalidStateError as exc:
        raise HTTPException(409, str(exc)) from None
    return {"id": job_id, "approved": decision.approved}


@app.get("/orders/{job_id}")
async def show(job_id: int) -> dict[str, Any]:
    try:
        job = await queue.get(job_id)
    except JobNotFoundError:
        raise HTTPException(404, f"no job {job_id}") from None
    return {"id": job.id, "type": job.type, "state": job.state.value, "result": job.result,
            "error": job.error}


@app.get("/healthz")
async def healthz() -> dict[str, bool]:
    return {"ok": True}

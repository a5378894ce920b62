"""A Flask app that enqueues with ``SyncQueue`` inside each request's own transaction, and the
worker that runs the jobs (another process).

POST /orders writes an order row and enqueues its ``send_receipt`` job in ONE transaction:
if the request fails after the enqueue (here: an order over the stock limit), the order and
its job are both rolled back; no receipt is ever sent for an order that does not exist.

Run it (SQLite file by default; any URL works, the same one for the app and the worker):

    pip install aiojobqueue flask  # in a clone: pip install -e . flask
    # PostgreSQL / MySQL: pip install "aiojobqueue[postgresql-sync]" / "aiojobqueue[mysql-sync]"
    AIOJOBQUEUE_URL=sqlite:///shop.db flask --app examples.flask_app run      # the web app
    AIOJOBQUEUE_URL=sqlite:///shop.db aiojobqueue worker examples.flask_app:queue  # jobs

    curl -X POST localhost:5000/orders -H 'content-type: application/json' \\
         -d '{"email": "ann@example.com", "quantity": 2}'
    curl localhost:5000/orders/1
"""

from __future__ import annotations

import os
from typing import Any

from flask import Flask, request
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, select

from aiojobqueue import InvalidJobError, JobContext, JobNotFoundError, JobQueue, SyncQueue

URL = os.environ.get("AIOJOBQUEUE_URL", "sqlite:///shop.db")
PREFIX = os.environ.get("AIOJOBQUEUE_PREFIX", "ajq_")
STOCK = 10  # the most of one item an order may take

# -- the worker's side: the handlers, served by `aiojobqueue worker examples.flask_app:queue`
queue = JobQueue(URL, prefix=PREFIX, poll_interval=float(os.environ.get("AIOJOBQUEUE_POLL", "1")))


@queue.handler("send_receipt", max_attempts=5)
async def send_receipt(ctx: JobContext, order_id: int, email: str) -> dict[str, Any]:
    """Pretend to mail a receipt (a real app calls its mail service here)."""
    return {"order_id": order_id, "sent_to": email}


# -- the web side: a synchronous app --------------------------------------------------------
jobs = SyncQueue(URL, prefix=PREFIX)
engine = jobs.engine  # the app's own tables share the queue's URL (its sync driver)
metadata = MetaData()
orders = Table(
    f"{PREFIX}shop_orders", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("email", String(200), nullable=False),
    Column("quantity", Integer, nullable=False),
    Column("receipt_job", Integer),
)
metadata.create_all(engine)

app = Flask(__name__)


class OutOfStock(Exception):
    """Raised after the enqueue: the whole transaction, job included, rolls back."""


@app.post("/orders")
def create_order() -> tuple[dict[str, Any], int]:
    body = request.get_json(force=True)
    try:
        with engine.begin() as conn:  # one transaction: the order row and its job
            order_id = conn.execute(insert(orders).values(
                email=body["email"], quantity=body["quantity"])).inserted_primary_key[0]
            job_id = jobs.enqueue(send_receipt, {"order_id": order_id, "email": body["email"]},
                                  key=f"receipt:{order_id}", connection=conn)
            conn.execute(orders.update().where(orders.c.id == order_id)
                         .values(receipt_job=job_id))
            if body["quantity"] > STOCK:
                raise OutOfStock(f"only {STOCK} in stock")
    except OutOfStock as exc:
        return {"error": str(exc), "rolled_back_job": job_id}, 409
    except InvalidJobError as exc:  # e.g. args that do not fit send_receipt
        return {"error": str(exc)}, 400
    return {"order_id": order_id, "receipt_job": job_id}, 201


@app.get("/orders/<int:order_id>")
def show_order(order_id: int) -> tuple[dict[str, Any], int]:
    with engine.connect() as conn:
        row = conn.execute(select(orders).where(orders.c.id == order_id)).first()
    if row is None:
        return {"error": f"no order {order_id}"}, 404
    job = jobs.get(row.receipt_job)
    return {"order_id": row.id, "email": row.email, "receipt": job.state.value,
            "result": job.result}, 200


@app.get("/jobs/<int:job_id>")
def show_job(job_id: int) -> tuple[dict[str, Any], int]:
    try:
        job = jobs.get(job_id)
    except JobNotFoundError as exc:
        return {"error": str(exc)}, 404
    return {"id": job.id, "type": job.type, "state": job.state.value}, 200

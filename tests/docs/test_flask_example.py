"""examples/flask_app.py for real: the Flask app (its dev server, threaded) enqueues with
SyncQueue inside each request's transaction, ``aiojobqueue worker`` runs the jobs in another
process; an order that fails after its enqueue leaves neither the order nor its job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from conftest import drop_tables, eventually
from sqlalchemy import MetaData, Table
from sqlalchemy.ext.asyncio import create_async_engine
from test_fastapi_example import free_port

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("flask", reason="Flask is a dev dependency (the example's)")


@pytest.mark.parametrize("db", ["sqlite", "postgresql", "mariadb"])
async def test_flask_app_enqueues_in_the_request_transaction(db_url: str, prefix: str) -> None:
    port = free_port()
    env = {**os.environ, "AIOJOBQUEUE_URL": db_url, "AIOJOBQUEUE_PREFIX": prefix,
           "AIOJOBQUEUE_POLL": "0.1", "PYTHONPATH": str(ROOT)}
    web = subprocess.Popen(  # noqa: ASYNC220 - returns at once
        [sys.executable, "-m", "flask", "--app", "examples.flask_app", "run",
         "--port", str(port)], cwd=ROOT, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    worker = None
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            async def up() -> bool:
                assert web.poll() is None, web.communicate()[0]
                try:
                    return (await http.get("/jobs/1")).status_code in (200, 404)
                except httpx.TransportError:
                    return False

            await eventually(up, timeout=60, every=0.2)
            # the schema exists now (the app made it): the worker may start
            worker = subprocess.Popen(  # noqa: ASYNC220
                [sys.executable, "-m", "aiojobqueue", "worker", "examples.flask_app:queue"],
                cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT)

            r = await http.post("/orders", json={"email": "ann@example.com", "quantity": 2})
            if r.status_code != 201:
                web.send_signal(signal.SIGINT)
                raise AssertionError(web.communicate(timeout=20)[0][-3000:])
            order = r.json()["order_id"]

            async def receipt_sent() -> bool:
                assert worker is not None and worker.poll() is None, worker.communicate()[0]
                return str((await http.get(f"/orders/{order}")).json()["receipt"]) == "done"

            await eventually(receipt_sent, timeout=60, every=0.1)
            body = (await http.get(f"/orders/{order}")).json()
            assert body["result"] == {"order_id": order, "sent_to": "ann@example.com"}

            # over the stock limit: raised after the enqueue, so the job is rolled back too
            r = await http.post("/orders", json={"email": "bob@example.com", "quantity": 99})
            assert r.status_code == 409, r.text
            lost = r.json()["rolled_back_job"]
            assert (await http.get(f"/jobs/{lost}")).status_code == 404
            assert (await http.get(f"/orders/{order + 1}")).status_code == 404
            # and the app goes on: the next order gets its job
            r = await http.post("/orders", json={"email": "cy@example.com", "quantity": 1})
            assert r.status_code == 201, r.text
            assert (await http.get(f"/jobs/{r.json()['receipt_job']}")).status_code == 200
    finally:
        for p in (worker, web):
            if p is None:
                continue
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
            try:
                p.communicate(timeout=20)  # also closes its pipe
            except subprocess.TimeoutExpired:
                p.kill()
                p.communicate()
        if not db_url.startswith("sqlite"):
            await drop_tables(db_url, prefix)
            engine = create_async_engine(db_url)
            try:
                async with engine.begin() as conn:
                    await conn.run_sync(lambda c: Table(
                        f"{prefix}shop_orders", MetaData()).drop(c, checkfirst=True))
            finally:
                await engine.dispose()

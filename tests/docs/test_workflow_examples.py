"""The workflow examples run as documented: examples/fan_in.py and
examples/cleanup_on_failure.py as scripts, and
examples/approval_webhook.py under a real uvicorn process, driven over HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import drop_tables, eventually
from test_fastapi_example import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
async def test_fan_in_example(db_url: str, prefix: str) -> None:
    env = {**os.environ, "AIOJOBQUEUE_URL": db_url, "AIOJOBQUEUE_PREFIX": prefix}
    try:
        p = subprocess.run(  # noqa: ASYNC221 - the test has nothing else to do meanwhile
            [sys.executable, "examples/fan_in.py"], cwd=ROOT, env=env,
            capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert p.stdout.strip() == "5 cities, warmest Lyon, mean 16.0"
    finally:
        if not db_url.startswith("sqlite"):
            await drop_tables(db_url, prefix)


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
async def test_cleanup_on_failure_example(db_url: str, prefix: str) -> None:
    env = {**os.environ, "AIOJOBQUEUE_URL": db_url, "AIOJOBQUEUE_PREFIX": prefix}
    try:
        p = subprocess.run(  # noqa: ASYNC221 - the test has nothing else to do meanwhile
            [sys.executable, "examples/cleanup_on_failure.py"], cwd=ROOT, env=env,
            capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert p.stdout.splitlines() == [
            "good: cleanup cancelled (ConditionNotMet), published True, staging left: ['good']",
            "bad: cleanup done, published False, staging left: ['good']",
        ]
    finally:
        if not db_url.startswith("sqlite"):
            await drop_tables(db_url, prefix)


@pytest.mark.parametrize("db", ["sqlite", "postgresql", "mariadb"])
async def test_approval_webhook_example(db_url: str, prefix: str) -> None:
    port = free_port()
    env = {**os.environ, "AIOJOBQUEUE_URL": db_url, "AIOJOBQUEUE_PREFIX": prefix,
           "AIOJOBQUEUE_POLL": "0.1", "APPROVAL_TIMEOUT": "3"}
    server = subprocess.Popen(  # noqa: ASYNC220 - returns at once
        [sys.executable, "-m", "uvicorn", "examples.approval_webhook:app", "--host",
         "127.0.0.1", "--port", str(port)], cwd=ROOT, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            async def up() -> bool:
                assert server.poll() is None, server.communicate()[0]
                try:
                    return (await http.get("/healthz")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(up, timeout=60, every=0.2)

            async def state(jid: int, want: str) -> bool:
                return bool((await http.get(f"/orders/{jid}")).json()["state"] == want)

            yes: dict[str, Any] = (await http.post("/orders", json={"sku": "mug"})).json()
            no: dict[str, Any] = (await http.post("/orders", json={"sku": "cup"})).json()
            late: dict[str, Any] = (await http.post("/orders", json={"sku": "jar"})).json()
            await eventually(lambda: state(yes["approval"], "external"), timeout=30)
            r = await http.post(f"/webhooks/approval/{yes['approval']}",
                                json={"approved": True, "by": "alice"})
            assert r.status_code == 200, r.text
            await eventually(lambda: state(yes["ship"], "done"), timeout=30)
            shipped = (await http.get(f"/orders/{yes['ship']}")).json()
            assert shipped["result"] == {"sku": "mug", "shipped": True, "approved_by": "alice"}
            # the webhook retried: refused, nothing changed
            r = await http.post(f"/webhooks/approval/{yes['approval']}",
                                json={"approved": False, "by": "mallory"})
            assert r.status_code == 409 and "already done" in r.json()["detail"]
            await eventually(lambda: state(no["approval"], "external"), timeout=30)
            r = await http.post(f"/webhooks/approval/{no['approval']}",
                                json={"approved": False, "by": "bob", "reason": "no stock"})
            assert r.status_code == 200
            assert await state(no["ship"], "cancelled")
            # nobody answers: the approval times out (3 s here), and ship with it
            await eventually(lambda: state(late["approval"], "failed"), timeout=60)
            err = (await http.get(f"/orders/{late['approval']}")).json()["error"]
            assert err["type"] == "ExternalTimeout"
            assert await state(late["ship"], "cancelled")
            r = await http.post(f"/webhooks/approval/{late['approval']}",
                                json={"approved": True})
            assert r.status_code == 409 and "already failed" in r.json()["detail"]
            assert (await http.post("/webhooks/approval/99999999",
                                    json={"approved": True})).status_code == 404
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        if server.stdout is not None:
            server.stdout.close()
        time.sleep(0.1)  # noqa: ASYNC251 - let the port go
        if not db_url.startswith("sqlite"):
            await drop_tables(db_url, prefix)

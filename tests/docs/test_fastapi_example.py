"""examples/fastapi_app.py under a real uvicorn process, driven over HTTP, on real databases."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import drop_tables, eventually

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("db", ["sqlite", "postgresql", "mariadb"])
async def test_fastapi_app_enqueues_runs_and_reports(db_url: str, prefix: str) -> None:
    port = free_port()
    env = {**os.environ, "AIOJOBQUEUE_URL": db_url, "AIOJOBQUEUE_PREFIX": prefix,
           "AIOJOBQUEUE_POLL": "0.1"}
    server = subprocess.Popen(  # noqa: ASYNC220 - returns at once
        [sys.executable, "-m", "uvicorn", "examples.fastapi_app:app", "--host", "127.0.0.1",
         "--port", str(port)], cwd=ROOT, env=env, text=True,
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

            r = await http.post("/jobs", json={"type": "resize",
                                               "args": {"image": "cat.png", "width": 64}})
            assert r.status_code == 201, r.text
            jid = r.json()["id"]

            async def state_of(i: int) -> str:
                return str((await http.get(f"/jobs/{i}")).json()["state"])

            async def done(i: int) -> bool:
                return await state_of(i) == "done"

            await eventually(lambda: done(jid), timeout=30, every=0.1)
            body = (await http.get(f"/jobs/{jid}")).json()
            assert body["result"] == {"image": "cat.png", "width": 64,
                                      "url": "/thumbs/64/cat.png"}
            assert body["attempts"] == 1

            r = await http.post("/albums", json={"name": "trip", "images": ["a.png", "b.png"]})
            assert r.status_code == 201, r.text
            album = r.json()
            await eventually(lambda: done(album["zip"]), timeout=30, every=0.1)
            z = (await http.get(f"/jobs/{album['zip']}")).json()
            assert z["result"] == {"album": "trip",
                                   "thumbs": ["/thumbs/200/a.png", "/thumbs/200/b.png"]}
            assert len(z["depends_on"]) == 2
            assert await state_of(album["container"]) == "done"

            assert (await http.get("/jobs/999999")).status_code == 404
            r = await http.post("/jobs", json={"type": "nope"})
            assert r.status_code == 400 and "unknown job type" in r.text
            r = await http.post("/jobs", content='{"type": "resize", "args": {"x": NaN}}',
                                headers={"content-type": "application/json"})
            assert r.status_code in (400, 422)  # not JSON-safe: refused, nothing stored

        # SIGTERM: uvicorn runs the lifespan exit, the worker shuts down gracefully
        server.send_signal(signal.SIGTERM)
        started = time.monotonic()
        out, _ = server.communicate(timeout=30)
        # uvicorn re-raises SIGTERM after a clean shutdown (newer versions): -15 is clean too
        assert server.returncode in (0, -signal.SIGTERM), out
        assert "Application shutdown complete" in out, out
        assert time.monotonic() - started < 30
        assert "Traceback" not in out, out
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
        if not db_url.startswith("sqlite"):
            await drop_tables(db_url, prefix)


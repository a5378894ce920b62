"""A second worker process gets work (issue 33, item 3): a FastAPI app embedding serve()
(default capacity 10, global cap 4) and an ``aiojobqueue worker`` on the same module share
80 jobs, with no setting beyond the cap. Before aiojobqueue.share, the process that claimed
first kept every slot (hand-over and held jobs) and the other one ran few or none."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import eventually
from sqlalchemy import func, select

from aiojobqueue import JobQueue

TESTS = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
async def test_app_and_worker_processes_share_the_jobs(
    make_queue: Callable[..., JobQueue], db_url: str, prefix: str,
) -> None:
    env = {**os.environ, "AIOJOBQUEUE_URL": db_url, "AIOJOBQUEUE_PREFIX": prefix}
    port = _free_port()
    procs: list[subprocess.Popen[str]] = []
    async with make_queue() as q:
        try:
            procs.append(subprocess.Popen(  # noqa: ASYNC220 - returns at once
                [sys.executable, "-m", "uvicorn", "shareapp:app", "--host", "127.0.0.1",
                 "--port", str(port), "--log-level", "warning"], cwd=TESTS, env=env,
                text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                async def up() -> bool:
                    assert procs[0].poll() is None, procs[0].communicate()[0]
                    try:
                        return (await http.get("/healthz")).status_code == 200
                    except httpx.TransportError:
                        return False

                await eventually(up, timeout=60, every=0.2)
                app_pid = (await http.get("/healthz")).json()["pid"]
            procs.append(subprocess.Popen(  # noqa: ASYNC220 - returns at once
                [sys.executable, "-m", "aiojobqueue", "worker", "shareapp:queue",
                 "--log-level", "warning"], cwd=TESTS, env=env, text=True,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
            # both processes are up and registered; then the jobs come (a deployment's
            # traffic): the first process to claim takes the 4 slots of the cap
            await eventually(lambda: _live_workers(q, procs), timeout=60, every=0.2)
            ids = [await q.enqueue("work", {"seconds": 0.5}) for _ in range(80)]
            t0 = time.monotonic()
            for i in ids:
                await q.wait(i, timeout=120)
            took = time.monotonic() - t0
            by_pid = Counter([(await q.get(i)).result["pid"] for i in ids])
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    await asyncio.to_thread(p.wait, 30)
                except subprocess.TimeoutExpired:
                    p.kill()
    worker_pid = procs[1].pid
    print(f"app ran {by_pid[app_pid]}, worker ran {by_pid[worker_pid]} of 80 in {took:.1f}s")
    assert set(by_pid) <= {app_pid, worker_pid}
    # both run a fair part (about half each)
    assert by_pid[worker_pid] >= 25, by_pid
    assert by_pid[app_pid] >= 25, by_pid


async def _live_workers(q: JobQueue, procs: list[subprocess.Popen[str]]) -> bool:
    for p in procs:
        assert p.poll() is None, p.communicate()[0]
    W = q._t.workers

    async def read(conn: Any) -> int:
        return int(await conn.scalar(select(func.count()).select_from(W)) or 0)

    return await q._read(read) >= 2

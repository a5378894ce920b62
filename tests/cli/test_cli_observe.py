"""The command line's observability: ``explain ID``, the flags of ``status`` (types that no
live worker serves, groups at their cap) and ``worker --metrics-port``; real processes."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from clikit import acli, one_line_error
from conftest import eventually

from aiojobqueue import JobContext, JobQueue, JobState


# Each call is a fresh process: SQLite and PostgreSQL here (the explain() reasons themselves
# run on every database in test_explain.py).
@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
async def test_explain_and_status_flags(db_url: str, prefix: str, make_queue: Any) -> None:
    """A live worker serving ``block`` with group ``g`` capped at 1: one job of ``g`` runs,
    the next is held by the cap, and a ``nobody`` job has no worker. ``status`` flags both;
    ``explain`` says which holds each job, in words and as JSON."""
    q: JobQueue = make_queue(group_limits={"g": 1}, heartbeat_interval=0.2, lease_ttl=5.0)
    gate = asyncio.Event()

    @q.handler("block")
    async def block(ctx: JobContext) -> None:
        await gate.wait()

    env = {"AIOJOBQUEUE_URL": db_url, "AIOJOBQUEUE_PREFIX": prefix}
    async with q:
        first = await q.enqueue("block", group="g")
        second = await q.enqueue("block", group="g")
        orphan = await q.enqueue("nobody")
        serving = asyncio.create_task(q.serve())
        try:
            async def running() -> bool:
                return (await q.get(first)).state == JobState.RUNNING

            await eventually(running, timeout=30)

            p = await acli("status", env=env)
            assert p.returncode == 0, p.stderr
            assert "type 'nobody': 1 runnable job(s) and no live worker serves it" in p.stdout
            assert "group 'g' is at its cap: 1 of 1 running, 1 ready" in p.stdout, p.stdout
            st = json.loads((await acli("status", "--json", env=env)).stdout)
            assert st["unserved_types"] == {"nobody": 1}
            assert st["groups_at_cap"] == [{"group": "g", "cap": 1, "running": 1, "ready": 1}]

            p = await acli("explain", str(second), env=env)
            assert p.returncode == 0, p.stderr
            assert "group_cap" in p.stdout and "Group 'g' is at its cap" in p.stdout, p.stdout
            e = json.loads((await acli("explain", str(orphan), "--json", env=env)).stdout)
            assert [r["code"] for r in e["reasons"]] == ["no_worker"]
            assert e["reasons"][0]["data"]["type"] == "nobody" and e["state"] == "ready"
            e = json.loads((await acli("explain", str(first), "--json", env=env)).stdout)
            assert [r["code"] for r in e["reasons"]] == ["running"]
            assert e["reasons"][0]["data"]["worker"] == q.worker_id
            one_line_error(await acli("explain", "999999", env=env), 1, "no job with id 999999")
        finally:
            gate.set()
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
    # the worker left (the second job stays ready): no cap holds, and no type is served
    st = json.loads((await acli("status", "--json", env=env)).stdout)
    assert st["groups_at_cap"] == [] and st["unserved_types"] == {"block": 1, "nobody": 1}


JOBS = """
from aiojobqueue import JobQueue

queue = JobQueue({url!r}, prefix={prefix!r}, poll_interval=0.1)


@queue.handler("ok")
async def ok(ctx):
    return ctx.attempt
"""


async def test_worker_serves_metrics(tmp_path: Path, prefix: str) -> None:
    """``worker --metrics-port 0`` serves /metrics on the port it logs: the jobs it ran by
    outcome, their run times, and the database's counts; a busy port is a usage error."""
    url = f"sqlite+aiosqlite:///{tmp_path}/q.db"
    (tmp_path / "obs_jobs.py").write_text(JOBS.format(url=url, prefix=prefix))
    proc = subprocess.Popen(  # noqa: ASYNC220 - returns at once
        [sys.executable, "-m", "aiojobqueue", "worker", "obs_jobs:queue", "--metrics-port", "0"],
        cwd=tmp_path, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    q = JobQueue(url, prefix=prefix)
    try:
        assert proc.stderr is not None
        port = None
        while port is None:  # the worker logs where it serves
            line = await asyncio.wait_for(asyncio.to_thread(proc.stderr.readline), 60)
            assert line, "the worker exited before serving metrics"
            m = re.search(r"metrics at http://0\.0\.0\.0:(\d+)/metrics", line)
            port = int(m.group(1)) if m else None
        async with q:
            ids = [await q.enqueue("ok") for _ in range(3)]
            assert [await q.wait(i, timeout=60) for i in ids] == [1, 1, 1]

        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                return r.read().decode()

        async def counted() -> bool:
            text = await asyncio.to_thread(scrape)
            # the database gauges are cached and read in the background: wait for them too
            return ('aiojobqueue_jobs_finished_total{group="default",outcome="done",type="ok"}'
                    ' 3.0' in text and "aiojobqueue_workers 1.0" in text)

        await eventually(counted, timeout=30)
        text = await asyncio.to_thread(scrape)
        assert 'aiojobqueue_job_run_seconds_count{type="ok"} 3.0' in text
        assert "aiojobqueue_workers 1.0" in text, text

        # the same port again: one line, exit 2, and no worker left behind
        busy = await acli("worker", "obs_jobs:queue", "--metrics-port", str(port),
                          "--log-level", "warning", cwd=tmp_path)
        one_line_error(busy, 2, f"--metrics-port {port}:")
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(proc.communicate, timeout=30)
        assert proc.returncode == 0 and "Traceback" not in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await q.close()

"""What a user sees without configuring logging, on every database: a process that sets up
no logging at all (as a script or an app under uvicorn) still gets a failed attempt, a job
failing for good, a shutdown waiting on running jobs and a lost database on stderr; and the
``aiojobqueue`` logger silences or routes them the usual way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import drop_tables

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r'''
import asyncio, logging, sys
sys.path.insert(0, sys.argv[4])  # tests/, for the TCP proxy
from aiojobqueue import JobQueue

url, prefix, mode = sys.argv[1:4]
if mode == "silenced":
    logging.getLogger("aiojobqueue").setLevel(logging.CRITICAL)
elif mode == "routed":
    logging.basicConfig(format="ROUTED %(name)s %(levelname)s %(message)s")


def make(u):
    return JobQueue(u, prefix=prefix, poll_interval=0.05, lease_ttl=2.0,
                    heartbeat_interval=0.4, retry_backoff=0.01, retry_backoff_max=0.02,
                    shutdown_timeout=0.3)


async def failures_and_shutdown():
    q = make(url)
    started = asyncio.Event()

    @q.handler("flaky", max_attempts=2)
    async def flaky(ctx):
        raise ValueError("boom")

    @q.handler("slow")
    async def slow(ctx):
        started.set()
        await asyncio.sleep(60)

    async with q:
        await q.enqueue("flaky")
        await q.run_until_idle()
        await q.enqueue("slow")
        serving = asyncio.create_task(q.serve())
        await started.wait()
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)


async def outage():
    from tcpproxy import TcpProxy

    async with TcpProxy.for_url(url) as px:
        q = make(px.url(url))
        done = asyncio.Event()

        @q.handler("t")
        async def t(ctx, n):
            if n == 1:
                done.set()

        async with q:
            serving = asyncio.create_task(q.serve())
            await q.enqueue("t", {"n": 0})
            await px.outage(1.5)
            await q.enqueue("t", {"n": 1})
            await asyncio.wait_for(done.wait(), 30)
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)


asyncio.run(outage() if mode == "outage" else failures_and_shutdown())
print("END")
'''


def run(tmp_path: Path, url: str, prefix: str, mode: str) -> str:
    script = tmp_path / "app.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(script), url, prefix, mode, str(ROOT / "tests")],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == "END", proc.stderr
    return proc.stderr


@pytest.fixture
async def clean(db_url: str, prefix: str):  # type: ignore[no-untyped-def]
    yield
    if not db_url.startswith("sqlite"):
        await drop_tables(db_url, prefix)


async def test_failures_and_a_slow_shutdown_show_without_configuration(
    db_url: str, prefix: str, tmp_path: Path, clean: None,
) -> None:
    err = run(tmp_path, db_url, prefix, "plain")
    lines = err.splitlines()
    assert any("(flaky) attempt 1 failed" in x and "ValueError: boom" in x and "retry in" in x
               for x in lines), err
    assert any("(flaky) attempt 2 failed for good" in x and "ValueError: boom" in x
               for x in lines), err
    assert "shutting down: waiting up to 0.3s for 1 running job(s)" in err
    assert "shutting down: cancelled 1 job(s) still running" in err
    # routine events stay quiet: no per-job line for a start or a success
    assert not any(" started" in x or " done" in x for x in lines), err


async def test_the_aiojobqueue_logger_silences_them(
    db_url: str, prefix: str, tmp_path: Path, clean: None,
) -> None:
    assert run(tmp_path, db_url, prefix, "silenced") == ""


async def test_an_app_logging_config_routes_them(
    db_url: str, prefix: str, tmp_path: Path, clean: None,
) -> None:
    err = run(tmp_path, db_url, prefix, "routed")
    assert "ROUTED aiojobqueue.jobs WARNING job" in err, err
    assert "ROUTED aiojobqueue.jobs ERROR job" in err, err
    assert "ROUTED aiojobqueue.worker WARNING shutting down" in err, err
    assert all(x.startswith(("ROUTED ", " ", "Traceback")) or not x for x in err.splitlines())


@pytest.mark.parametrize("db", ["postgresql", "mariadb"], indirect=True)
async def test_a_lost_database_and_its_retry_show(
    db_url: str, prefix: str, tmp_path: Path, clean: None,
) -> None:
    """A database over the network going away (a TCP proxy refusing and cutting the link;
    SQLite is a local file, it has no such outage)."""
    err = run(tmp_path, db_url, prefix, "outage")
    retried = [x for x in err.splitlines()
               if "retrying" in x or "backing off" in x]
    assert retried, err

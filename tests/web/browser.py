"""Browser-test helpers: a dashboard server process and Debian's chromium via Playwright."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
HERE = Path(__file__).parent
ROOT = HERE.parent.parent


def chromium() -> str:
    """The chromium binary on PATH; skip without it (fail in CI, where .ci/run installs it)."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        msg = "chromium is not on PATH (apt-get install -y chromium)"
        if IN_CI:
            pytest.fail(msg + " (CI=true: browser tests must run)")
        pytest.skip(msg)
    try:
        import playwright  # noqa: F401
    except ImportError:
        msg = "playwright is not installed (pip install playwright)"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def served(url: str, prefix: str, level: str = "full") -> AsyncIterator[str]:
    """A dashboard process on a free port; yields its base URL once it answers. Waits
    without blocking the loop: the test's own worker may be serving in it."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")])}
    # Popen returns at once; the wait below polls without blocking the loop
    proc = subprocess.Popen([sys.executable, str(HERE / "dashserver.py"), url, prefix,  # noqa: ASYNC220
                             str(port), level], env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        async with httpx.AsyncClient(timeout=2) as c:
            while True:
                if proc.poll() is not None:
                    raise AssertionError(f"the dashboard process exited ({proc.returncode})")
                try:
                    if (await c.get(base + "/")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError("the dashboard process did not answer within 30 s")
                await asyncio.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        for _ in range(100):
            if proc.poll() is not None:
                break
            await asyncio.sleep(0.1)
        else:
            proc.kill()
            proc.wait()

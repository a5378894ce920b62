"""The newcomer's first hour, scripted: a copy of the checkout, a fresh virtualenv, the
README's commands verbatim, its "In code" example on every database, and its FastAPI app
with `aiojobqueue worker` in a second process sharing the work.

Nothing here uses the test suite's environment but its database servers: the commands run
under ``bash`` in the copy, with the fresh venv's ``bin`` first on PATH (what ``. .venv/bin/
activate`` does), and the code runs under that venv's Python. The only changes to what the
README shows are the ones its own text invites: the database URL (a fresh database on each
server) and uvicorn's port (a free one, so parallel runs never collide).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import server_url
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def section(title: str) -> str:
    """The README's text under the heading ``## title`` (to the next ``## ``)."""
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", README, re.S | re.M)
    assert m, title
    return m[1]


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def copy_checkout(dest: Path) -> None:
    """What a clone holds: the tracked files and the new ones not ignored (no .venv)."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        if (ROOT / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dest / f)


class Newcomer:
    """A copy of the checkout with a fresh venv made by the README's own commands."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.bin = home / ".venv" / "bin"
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("VIRTUAL_ENV", "PYTHON", "AIOJOBQUEUE_"))}
        self.env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"

    def bash(self, script: str, cwd: Path | None = None, timeout: float = 600
             ) -> subprocess.CompletedProcess[str]:
        """``script`` under bash -e; after the venv exists its bin is first on PATH."""
        env = {**self.env, "PATH": f"{self.bin}:{self.env['PATH']}"}
        if self.bin.exists():
            env["VIRTUAL_ENV"] = str(self.bin.parent)
        return subprocess.run(["bash", "-ec", script], cwd=cwd or self.home, env=env,
                              capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def newcomer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Newcomer, str]]:
    """The quick start run verbatim in a fresh copy; yields it with the README's block that
    explores the demo's database."""
    home = tmp_path_factory.mktemp("clone")
    copy_checkout(home)
    nc = Newcomer(home)
    (quick, explore) = blocks(section("Quick start"), "bash")
    p = nc.bash(quick)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert (nc.bin / "aiojobqueue").exists()
    assert "done" in p.stdout, p.stdout[-3000:]  # the demo's summary
    yield nc, explore


def test_the_quick_start_runs_verbatim(newcomer: tuple[Newcomer, str]) -> None:
    nc, explore = newcomer
    assert (nc.home / "aiojobqueue-demo.db").exists()
    p = nc.bash(explore)  # the README's block that explores the demo, verbatim
    assert p.returncode == 0, p.stderr
    assert "tenant" in p.stdout and "Usage" in p.stdout  # status and jobs, then --help


def fresh_database(db: str) -> tuple[str, str]:
    """(URL of a new empty database on that server, its name): the snippet's own tables,
    default prefix and all, never meet another test's."""
    name = f"newcomer_{uuid.uuid4().hex[:10]}"
    base = server_url(db)

    async def create() -> None:
        engine = create_async_engine(base, isolation_level="AUTOCOMMIT")
        async with engine.connect() as conn:
            await conn.execute(text(f"CREATE DATABASE {name}"))
        await engine.dispose()

    asyncio.run(create())
    return base.rsplit("/", 1)[0] + "/" + name, name


def drop_database(db: str, name: str) -> None:
    async def drop() -> None:
        engine = create_async_engine(server_url(db), isolation_level="AUTOCOMMIT")
        async with engine.connect() as conn:
            await conn.execute(text(f"DROP DATABASE IF EXISTS {name}"))
        await engine.dispose()

    asyncio.run(drop())


@pytest.fixture(scope="module")
def with_drivers(newcomer: tuple[Newcomer, str]) -> Newcomer:
    """The README's install line for a clone with both server drivers, verbatim."""
    nc = newcomer[0]
    (line,) = re.findall(r'`(pip install -e "\.\[postgresql,mysql\]")`', section("Install"))
    p = nc.bash(line)
    assert p.returncode == 0, p.stderr[-3000:]
    return nc


@pytest.mark.parametrize("db", ["sqlite", "postgresql", "mariadb"])
def test_the_in_code_example_on_each_database(
        db: str, with_drivers: Newcomer, tmp_path: Path) -> None:
    (code,) = blocks(section("In code"), "python")
    default = '"sqlite+aiosqlite:///jobs.db"'
    assert default in code
    name = None
    if db != "sqlite":
        url, name = fresh_database(db)
        code = code.replace(default, repr(url))
    (tmp_path / "example.py").write_text(code)
    try:
        p = with_drivers.bash(f"python {tmp_path / 'example.py'}", cwd=tmp_path, timeout=180)
    finally:
        if name:
            drop_database(db, name)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split() == ["2", "3"], p.stdout


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(nc: Newcomer, command: str, cwd: Path, log: Path) -> subprocess.Popen[str]:
    env = {**nc.env, "PATH": f"{nc.bin}:{nc.env['PATH']}", "VIRTUAL_ENV": str(nc.bin.parent)}
    with log.open("w") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=cwd, env=env,
                                text=True, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_fastapi_app_and_a_worker_process_both_run_jobs(
        newcomer: tuple[Newcomer, str], tmp_path: Path) -> None:
    """The README's app.py served by uvicorn, plus `aiojobqueue worker app:queue`, as the
    README shows them, with no setting beyond its example: both processes run jobs."""
    nc = newcomer[0]
    text_ = section("In a FastAPI app")
    (install,) = re.findall(r"`(pip install fastapi uvicorn)`", text_)
    p = nc.bash(install)
    assert p.returncode == 0, p.stderr[-3000:]
    (app,) = blocks(text_, "python")
    (commands,) = blocks(text_, "bash")
    serve_cmd, worker_cmd = (line.split("#")[0].strip() for line in commands.splitlines())
    assert serve_cmd == "uvicorn app:app" and worker_cmd == "aiojobqueue worker app:queue"
    (tmp_path / "app.py").write_text(app)
    port = free_port()
    server = start(nc, f"{serve_cmd} --port {port}", tmp_path, tmp_path / "uvicorn.log")
    worker = None
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        while True:
            assert server.poll() is None, (tmp_path / "uvicorn.log").read_text()
            try:
                if httpx.get(f"{base}/docs", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "uvicorn.log").read_text()
            time.sleep(0.2)
        worker = start(nc, worker_cmd, tmp_path, tmp_path / "worker.log")
        time.sleep(5)  # the worker has started and registered
        assert worker.poll() is None, (tmp_path / "worker.log").read_text()
        ids = [httpx.post(f"{base}/reports", params={"tenant": f"t{i % 4}"}, timeout=10
                          ).json()["id"] for i in range(32)]
        results = wait_all(base, ids, deadline=time.monotonic() + 120)
    finally:
        stop(server)
        if worker is not None:
            stop(worker)
    pids = {r["pid"] for r in results}
    per_pid = {pid: sum(r["pid"] == pid for r in results) for pid in pids}
    logs = ((tmp_path / "uvicorn.log").read_text()[-2000:]
            + (tmp_path / "worker.log").read_text()[-2000:])
    assert server.pid in pids and worker is not None and worker.pid in pids, (per_pid, logs)


def wait_all(base: str, ids: list[int], deadline: float) -> list[dict[str, object]]:
    """Every job's result, once all are done (fails at the deadline, saying which are not)."""
    while True:
        bodies = [httpx.get(f"{base}/jobs/{i}", timeout=10).json() for i in ids]
        if all(b["state"] == "done" for b in bodies):
            return [b["result"] for b in bodies]
        assert time.monotonic() < deadline, bodies
        time.sleep(0.5)


if __name__ == "__main__":  # pragma: no cover - run by hand: python tests/docs/test_newcomer.py
    sys.exit(pytest.main([__file__, "-v"]))

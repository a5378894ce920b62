"""What a new user meets on the command line (issue 33, items 7 and 9): the demo's hints
and event panel, ``show --traceback`` with every failed attempt, and ``status`` in an
80-column terminal."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from clikit import acli
from conftest import eventually
from rich.console import Console

from aiojobqueue import JobContext, JobQueue, JobState, admin
from aiojobqueue.cli.render import STATUS_COLUMNS, status_view
from aiojobqueue.demo import DemoRun, render


def test_demo_hint_names_the_web_extra(tmp_path: Path) -> None:
    console_script = Path(sys.executable).parent / "aiojobqueue"
    p = subprocess.run([str(console_script), "demo", "--speed", "8"], capture_output=True,
                       text=True, cwd=tmp_path, timeout=120,
                       env={**os.environ, "COLUMNS": "80"})
    assert p.returncode == 0, p.stderr
    assert 'pip install "aiojobqueue[web]"' in p.stdout, p.stdout[-600:]


def _panel_text(run: DemoRun) -> str:
    console = Console(width=100, record=True, file=io.StringIO())
    console.print(render(run, None, 100))
    return console.export_text()


def test_demo_event_panel_says_what_it_waits_for() -> None:
    run = DemoRun("sqlite+aiosqlite:///demo.db")
    assert "waiting for the first results" in _panel_text(run)
    run.outcomes["done"] = 22  # 22 fetches and parses done, no merge, report or retry yet
    text = _panel_text(run)
    assert "waiting for the first results" not in text
    assert "22 fetch/parse job(s) done so far" in text


# -- status in 80 columns ---------------------------------------------------------------------
def _status_text(st: admin.Status, width: int = 80) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    for part in status_view(st, "postgresql://app@db.internal.example/jobs", width=width):
        console.print(part)
    return console.export_text()


def _busy_status() -> admin.Status:
    now = datetime.now(UTC)
    names = ["default", "acme", "tenant-globex-eu-west", "a-group-name-longer-than-24-chars"]
    groups = [admin.GroupStatus(g, {c: 10 ** (i % 4) for i, c in enumerate(STATUS_COLUMNS)},
                                125.0) for g in names]
    totals = {c: sum(g.count(c) for g in groups) for c in STATUS_COLUMNS}
    workers = [admin.WorkerInfo("9f1c2e3d4b5a", "a-rather-long-host.example.internal", 123456,
                                now, now, 4, 1.2, 8)]
    return admin.Status(now, totals, {}, groups, workers, 0, 60.0)


def test_status_fits_80_columns_every_state_in_use() -> None:
    text = _status_text(_busy_status())
    lines = text.splitlines()
    assert all(len(line.rstrip()) <= 80 for line in lines), text
    head = next(line for line in lines if line.lstrip().startswith("group"))
    assert head.split() == ["group", *STATUS_COLUMNS, "oldest"], text  # no heading cut
    for g in ("default", "acme"):  # whole, on one line
        assert any(line.lstrip().startswith(g + " ") for line in lines), (g, text)
    # a name too long for its column is cut with an ellipsis, never wrapped
    assert any(line.lstrip().startswith("a-group-") and "…" in line for line in lines)
    assert not any(line.lstrip().startswith("chars") for line in lines)
    # with fewer states in use the same name has room to show whole
    wide = _status_text(_busy_status(), width=120)
    assert any(line.lstrip().startswith("tenant-globex-eu-west ") for line in wide.splitlines())
    whead = next(line for line in lines if line.lstrip().startswith("worker "))
    assert whead.split() == ["worker", "host", "pid", "running", "leased", "seen", "up",
                             "since"], text


def test_status_leaves_out_states_no_job_is_in() -> None:
    st = _busy_status()
    for g in st.groups:
        g.counts = {"done": 3}
    st.totals = {"done": 12}
    head = next(line for line in _status_text(st).splitlines()
                if line.lstrip().startswith("group"))
    assert head.split() == ["group", "running", "ready", "done", "failed", "oldest"]


# -- real databases, real processes -----------------------------------------------------------
async def test_show_traceback_shows_every_failed_attempt(
    db_url: str, prefix: str, make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue()

    @q.handler("flaky", max_attempts=3)
    async def flaky(ctx: JobContext) -> str:
        if ctx.attempt < 3:
            raise ValueError(f"boom number {ctx.attempt}")
        return "ok"

    env = {"AIOJOBQUEUE_URL": db_url, "AIOJOBQUEUE_PREFIX": prefix}
    async with q:
        jid = await q.enqueue("flaky")
        await q.run_until_idle()
        assert (await q.get(jid)).state == JobState.DONE
    p = await acli("show", str(jid), "--traceback", env={**env, "COLUMNS": "100"})
    assert p.returncode == 0, p.stderr
    for n in (1, 2):
        assert f"traceback of attempt {n} · ValueError: boom number {n}" in p.stdout, p.stdout
        assert 'raise ValueError(f"boom number {ctx.attempt}")' in p.stdout
    assert p.stdout.count("Traceback (most recent call last)") == 2, p.stdout


async def test_status_worker_counts_agree_with_the_groups_and_fit_80_columns(
    db_url: str, prefix: str, make_queue: Callable[..., JobQueue],
) -> None:
    # a heartbeat far apart: the registry's own count is seconds old when status reads
    q = make_queue(lease_ttl=30.0, heartbeat_interval=10.0)
    gate = asyncio.Event()

    @q.handler("block")
    async def block(ctx: JobContext) -> None:
        await gate.wait()

    env = {"AIOJOBQUEUE_URL": db_url, "AIOJOBQUEUE_PREFIX": prefix}
    async with q:
        ids = [await q.enqueue("block", group="tenant-globex-eu") for _ in range(3)]
        serving = asyncio.create_task(q.serve())
        try:
            async def running() -> bool:
                states = [(await q.get(i)).state for i in ids]
                return states == [JobState.RUNNING] * 3

            await eventually(running, timeout=30)
            st = json.loads((await acli("status", "--json", env=env)).stdout)
            p = await acli("status", env={**env, "COLUMNS": "80"})
        finally:
            gate.set()
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
    assert st["totals"]["running"] == 3
    assert [w["running"] for w in st["workers"]] == [3], st["workers"]
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert all(len(line.rstrip()) <= 80 for line in lines), p.stdout
    assert any(line.lstrip().startswith("tenant-globex-eu ") for line in lines), p.stdout
    row = next(line for line in lines if line.lstrip().startswith(q.worker_id[:8]))
    assert row.split()[3:5] == ["3", "0"], p.stdout  # running 3, leased 0

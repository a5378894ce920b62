"""The command line end to end: real processes on real databases."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from clikit import ROOT, acli, cli, one_line_error
from conftest import drop_tables, eventually, server_url

from aiojobqueue import JobQueue, JobState
from aiojobqueue.schema import SCHEMA_VERSION

EXAMPLE = ROOT / "examples" / "multi_worker"


def test_demo_finishes_with_every_job_done(tmp_path: Path) -> None:
    console_script = Path(sys.executable).parent / "aiojobqueue"
    p = subprocess.run([str(console_script), "demo", "--speed", "6", "--json"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    v = json.loads(p.stdout)
    assert v["ok"] is True
    assert v["states"] == {"done": v["jobs"]} and v["jobs"] == 71
    assert v["flaky_job"]["attempts"] == 2 and v["flaky_job"]["state"] == "done"
    assert v["events"]["retry"] == 1 and "failed" not in v["events"]
    assert v["publish_job"]["result"] == {"published": ["acme", "globex"]}
    assert v["elapsed"] < 60
    # what it left behind is there to explore, and matches
    url = f"sqlite+aiosqlite:///{tmp_path}/aiojobqueue-demo.db"
    st = json.loads(cli("status", "--url", url, "--json").stdout)
    assert st["totals"] == {"done": 69} and st["containers"] == {"done": 2}
    assert st["workers"] == []  # the demo's worker left the registry on exit
    p = cli("status", "--url", url)  # the human views render too
    assert p.returncode == 0 and "globex" in p.stdout and "oldest" in p.stdout
    p = cli("show", "1", "--url", url, "--limit", "3")
    assert "children (33: 33 done)" in p.stdout and "30 more" in p.stdout, p.stdout
    p = cli("jobs", "--url", url, "--group", "acme", "--type", "merge")
    assert p.returncode == 0 and "merge" in p.stdout and "16 jobs" in p.stdout, p.stdout
    g = json.loads(cli("show", str(v["flaky_job"]["id"]), "--url", url, "--json").stdout)
    assert g["job"]["attempts"] == 2 and [a["type"] for a in g["ancestors"]] == [
        "globex-nightly"]
    assert [d["type"] for d in g["dependents"]] == ["parse"]


# Each call is a fresh process (~1 s on a loaded machine): SQLite and PostgreSQL here;
# MariaDB runs the same admin functions in-process in test_admin.py.
@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
async def test_operator_commands(db_url: str, prefix: str, make_queue: Any) -> None:
    q: JobQueue = make_queue()

    @q.handler("ok")
    async def ok(ctx: Any) -> str:
        return "fine"

    @q.handler("bad", max_attempts=1)
    async def bad(ctx: Any) -> None:
        raise RuntimeError("kaput")

    async with q:
        async with q.batch() as b:
            box = b.container("box", group="t1")
            good = b.add("ok", parent=box, group="t1")
            broken = b.add("bad", parent=box, group="t1", depends_on=[good])
            after = b.add("ok", group="t1", depends_on=[broken])
            idle = b.add("nohandler", group="t2")
        await q.run_until_idle()
        assert (await q.get(after.id)).state == JobState.CANCELLED
    env = {"AIOJOBQUEUE_URL": db_url, "AIOJOBQUEUE_PREFIX": prefix}

    p = await acli("status", "--json", env=env)
    assert p.returncode == 0, p.stderr
    st = json.loads(p.stdout)
    groups = {g["group"]: g["counts"] for g in st["groups"]}
    assert groups == {"t1": {"done": 1, "failed": 1, "cancelled": 1}, "t2": {"ready": 1}}
    assert st["containers"] == {"failed": 1}
    assert st["oldest_ready_age"] is not None

    p = await acli("jobs", "--state", "failed", "--type", "bad", "--json", env=env)
    (failed,) = json.loads(p.stdout)
    assert failed["id"] == broken.id and failed["error"]["message"] == "kaput"
    assert failed["depends_on"] == [good.id] and failed["parent_id"] == box.id

    g = json.loads((await acli("show", str(broken.id), "--json", env=env)).stdout)
    assert [a["id"] for a in g["ancestors"]] == [box.id]
    assert [d["id"] for d in g["dependencies"]] == [good.id]
    assert [d["id"] for d in g["dependents"]] == [after.id]
    p = await acli("show", str(broken.id), "--traceback", env=env)
    assert "RuntimeError: kaput" in p.stdout and "traceback" in p.stdout

    # retry the failure: it and the job it cancelled come back, and the container reopens
    p = await acli("retry", str(broken.id), "--json", env=env)
    assert p.returncode == 0, p.stderr
    assert sorted(json.loads(p.stdout)["revived"]) == sorted([box.id, broken.id, after.id])
    async with q:
        assert (await q.get(broken.id)).state == JobState.READY
        assert (await q.get(after.id)).state == JobState.WAITING
    one_line_error(await acli("retry", str(good.id), env=env), 1, f"job {good.id} is done")
    one_line_error(await acli("retry", "999999", env=env), 1, "no job with id 999999")

    p = await acli("cancel", str(idle.id), env=env)
    assert p.returncode == 0 and "cancelled" in p.stdout, p.stderr
    one_line_error(await acli("cancel", str(good.id), env=env), 1, f"job {good.id} is already")

    # prune: the container tree is live again, so only the cancelled top-level job goes
    p = await acli("prune", "--older-than", "0s", "--dry-run", "--json", env=env)
    assert json.loads(p.stdout)["jobs"] == 1
    p = await acli("prune", "--older-than", "0s", env=env)
    assert p.returncode == 0 and "deleted 1 job(s)" in p.stdout, p.stdout
    one_line_error(await acli("show", str(idle.id), env=env), 1, f"no job with id {idle.id}")
    p = await acli("prune", "--older-than", "7x", env=env)
    assert p.returncode == 2 and "bad age" in p.stderr and "Traceback" not in p.stderr

    p = await acli("migrate", "--check", env=env)
    assert p.returncode == 0 and "current (version" in p.stdout, p.stderr


async def test_migrate_creates_then_checks(db_url: str, prefix: str) -> None:
    env = {"AIOJOBQUEUE_URL": db_url, "AIOJOBQUEUE_PREFIX": prefix}
    try:
        sqlite = db_url.startswith("sqlite")
        one_line_error(await acli("migrate", "--check", env=env), 3 if sqlite else 4,
                       "no SQLite database" if sqlite else "no aiojobqueue schema")
        p = await acli("migrate", env=env)
        assert p.returncode == 0 and f"version {SCHEMA_VERSION}" in p.stdout, p.stderr
        assert (await acli("migrate", "--check", env=env)).returncode == 0
        st = json.loads((await acli("status", "--json", env=env)).stdout)
        assert st["groups"] == [] and st["totals"] == {}
    finally:
        if not db_url.startswith("sqlite"):
            await drop_tables(db_url, prefix)


@pytest.mark.parametrize(("args", "code", "starts"), [
    (["status", "--url", "postgresql://postgres@127.0.0.1:1/test"], 3,
     "cannot reach the database at postgresql+asyncpg://postgres@127.0.0.1:1/test"),
    (["jobs", "--url", "mysql://root:secret@127.0.0.1:1/test"], 3,
     "cannot reach the database at mysql+aiomysql://root:***@127.0.0.1:1/test"),
    (["status", "--url", "not a url"], 2, "bad database URL"),
    (["status", "--url", "oracle+nothing://x/y"], 2, "bad database URL"),
    (["status", "--url", "sqlite:///does/not/exist.db"], 3, "no SQLite database"),
    (["jobs", "--state", "bogus", "--url", "sqlite:///x.db"], 3, "no SQLite database"),
])
def test_user_errors_are_one_line(args: list[str], code: int, starts: str) -> None:
    one_line_error(cli(*args), code, starts)


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/q.db"
    assert cli("migrate", "--url", url).returncode == 0
    p = cli("jobs", "--state", "bogus", "--url", url)
    one_line_error(p, 2, "unknown state 'bogus'")
    for args, starts in ((["worker", "nosuchmodule:queue"], "cannot import 'nosuchmodule'"),
                         (["worker", "os:path"], "os:path is a module, not a JobQueue"),
                         (["worker", "os:nothing"], "module 'os' has no attribute 'nothing'"),
                         (["worker", "noattr"], "expected MODULE:QUEUE")):
        one_line_error(cli(*args, cwd=tmp_path), 2, starts)
    for args in (["nosuchcommand"], ["show", "notanumber"]):
        p = cli(*args, cwd=tmp_path)
        assert p.returncode == 2 and "Traceback" not in p.stderr, (args, p.stderr)
    assert cli("--version").stdout.startswith("aiojobqueue ")


async def test_worker_command_runs_jobs_on_several_processes(prefix: str) -> None:
    url = server_url("postgresql")
    env = {**os.environ, "AIOJOBQUEUE_URL": url, "AIOJOBQUEUE_PREFIX": prefix,
           "AIOJOBQUEUE_POLL": "0.1", "PYTHONUNBUFFERED": "1"}
    procs: list[subprocess.Popen[str]] = []
    q = JobQueue(url, prefix=prefix)
    try:
        assert cli("migrate", env={"AIOJOBQUEUE_URL": url, "AIOJOBQUEUE_PREFIX": prefix}
                   ).returncode == 0
        for fmt in ("text", "json"):
            procs.append(subprocess.Popen(  # noqa: ASYNC220 - returns at once
                [sys.executable, "-m", "aiojobqueue", "worker", "jobs:queue",
                 "--log-format", fmt], cwd=EXAMPLE, env=env, text=True,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        async with q:
            from aiojobqueue import admin

            async def both_up() -> bool:
                return len((await admin.status(q)).workers) == 2

            await eventually(both_up, timeout=30)
            async with q.batch() as b:
                refs = [b.add("render", {"n": i, "seconds": 0.3},
                              group="video" if i % 2 else "audio") for i in range(12)]
            results = [await q.wait(r.id, timeout=60) for r in refs]
            assert sorted(r["n"] for r in results) == list(range(12))
            assert len({r["pid"] for r in results}) == 2  # capacity 4 each: both worked
            assert {r["pid"] for r in results} == {p.pid for p in procs}
            for p in procs:
                p.send_signal(signal.SIGTERM)
            started = time.monotonic()
            outs = [p.communicate(timeout=30) for p in procs]
            assert time.monotonic() - started < 30
            assert [p.returncode for p in procs] == [0, 0], outs
            assert (await admin.status(q)).workers == []  # both left the registry
        text_err, json_err = outs[0][1], outs[1][1]
        assert "starting: jobs:queue" in text_err and "stopped" in text_err
        assert "Traceback" not in text_err + json_err
        records = [json.loads(line) for line in json_err.splitlines() if line.startswith("{")]
        jobs = [r for r in records if "job_id" in r]
        assert jobs, json_err
        for r in jobs:
            assert {"job_id", "job_type", "attempt", "worker", "group"} <= r.keys()
            assert r["job_type"] == "render" and r["attempt"] == 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        await q.close()
        await drop_tables(url, prefix)


def test_worker_whose_module_fails_to_import_is_a_one_line_usage_error(tmp_path: Path) -> None:
    # FastAPI "not installed": a package on the path in front of the real one that fails
    # the way a missing one does, so the real example module is what gets imported.
    shadow = tmp_path / "shadow" / "fastapi"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'fastapi'\", name='fastapi')\n")
    path = [str(shadow.parent), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    env = {"PYTHONPATH": os.pathsep.join(p for p in path if p)}
    one_line_error(cli("worker", "examples.fastapi_app:queue", env=env), 2,
                   "cannot import 'examples.fastapi_app': it imports 'fastapi', which is not "
                   "installed")
    # a module that raises while it runs: its error in one line, and how to see more
    (tmp_path / "broken_jobs.py").write_text("raise RuntimeError('no config for tenant x')\n")
    p = cli("worker", "broken_jobs:queue", cwd=tmp_path)
    one_line_error(p, 2, "cannot import 'broken_jobs': RuntimeError: no config for tenant x")
    assert "python -c 'import broken_jobs'" in p.stderr


def test_times_read_as_ago_or_in() -> None:
    from datetime import UTC, datetime, timedelta

    from aiojobqueue.cli.render import ago, when

    now = datetime(2026, 12, 1, 21, 0, 0, tzinfo=UTC)
    assert when(now + timedelta(minutes=59, seconds=39), now) == \
        "2026-12-01 21:59:39 (in 59m39s)"
    assert when(now - timedelta(seconds=4.2), now) == "2026-12-01 20:59:55 (4.2s ago)"
    assert when(now, now) == "2026-12-01 21:00:00 (0.0s ago)"
    assert when(None, now) == "-" and when(now) == "2026-12-01 21:00:00"
    assert [ago(s) for s in (-3579.4, 42, 7300, 200000)] == ["59m39s", "42s", "2h01m", "2d07h"]


async def test_show_tells_when_a_scheduled_job_will_run(
    queue: JobQueue, db_url: str, prefix: str
) -> None:
    from datetime import timedelta

    jid = await queue.enqueue("later", run_after=timedelta(hours=1))
    assert (await queue.get(jid)).state == JobState.SCHEDULED
    p = await acli("show", str(jid), env={"AIOJOBQUEUE_URL": db_url,
                                          "AIOJOBQUEUE_PREFIX": prefix})
    assert p.returncode == 0, p.stderr
    (line,) = [ln for ln in p.stdout.splitlines() if "run after" in ln]
    assert re.search(r"run after\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(in (59m\d\ds|1h00m)\)",
                     line), line
    assert "ago" not in line and "-" not in line.split("(")[1], line
    (created,) = [ln for ln in p.stdout.splitlines() if "created" in ln]
    assert re.search(r"\(\d+(\.\d)?s ago\)", created), created


async def test_interrupted_demo_leaves_no_job_running_and_no_live_worker(
    db_url: str, prefix: str, make_queue: Any
) -> None:
    """Ctrl-C (SIGINT) in the middle of the demo: it shuts its worker down gracefully."""
    from aiojobqueue import admin

    env = {"AIOJOBQUEUE_URL": db_url, "AIOJOBQUEUE_PREFIX": prefix}
    assert (await acli("migrate", env=env)).returncode == 0
    base = {k: v for k, v in os.environ.items() if not k.startswith("AIOJOBQUEUE_")}
    demo = subprocess.Popen(  # noqa: ASYNC220 - returns at once
        [sys.executable, "-m", "aiojobqueue", "demo", "--url", db_url, "--prefix", prefix,
         "--speed", "0.5", "--json"], cwd=ROOT, env=base, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    q: JobQueue = make_queue()
    try:
        async with q:
            async def busy() -> bool:
                assert demo.poll() is None, demo.communicate()
                st = await admin.status(q)
                return st.totals.get("running", 0) > 0 and len(st.workers) == 1

            await eventually(busy, timeout=60, every=0.1)
            demo.send_signal(signal.SIGINT)
            out, err = await asyncio.to_thread(demo.communicate, timeout=60)
            assert demo.returncode == 130, (out, err)
            assert "interrupted" in err and "Traceback" not in err, err
            st = await admin.status(q)
            assert "running" not in st.totals, st.totals
            assert st.workers == [] and st.stale_workers == 0  # it left the registry
            assert st.totals.get("done", 0) < 69  # it was stopped, not run to the end
            assert not [j for j in await admin.list_jobs(q, limit=1000) if j.lease_owner]
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()

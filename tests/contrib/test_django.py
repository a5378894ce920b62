"""The Django task backend (aiojobqueue.contrib.django) in a real Django project
(tests/contrib/djsite) on each database as Django's own: a view enqueues through Django's
test client, ``manage.py aiojobqueue_worker`` processes run the tasks (plain and async),
results come back through ``get_result``; a SIGKILLed worker's task runs again and
finishes once; a rolled-back ``atomic()`` leaves no task; Django's backend validation
(the checks django-tasks's own backend tests make: priority, naive run_after, unknown
queue name) holds.

Each step runs in a process of its own (drive.py for the app's side), as in production."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import drop_tables, server_url

SITE = Path(__file__).with_name("djsite")


class Site:
    """The test project on one database, with its worker processes."""

    def __init__(self, db: str, prefix: str, tmp: Path) -> None:
        self.log = tmp / "events.jsonl"
        self.log.touch()
        self.tmp = tmp
        self.env = {**os.environ, "AJQ_DJ_DB": db, "AJQ_DJ_PREFIX": prefix,
                    "AJQ_DJ_SQLITE": str(tmp / "site.db"), "AJQ_DJ_LOG": str(self.log)}
        self.workers: list[subprocess.Popen[bytes]] = []

    def drive(self, *args: str) -> Any:
        out = subprocess.run([sys.executable, str(SITE / "drive.py"), *args], env=self.env,
                             capture_output=True, timeout=120)
        assert out.returncode == 0, out.stderr.decode()[-3000:]
        return json.loads(out.stdout.decode().strip().splitlines()[-1])

    def worker(self) -> subprocess.Popen[bytes]:
        n = len(self.workers)
        err = open(self.tmp / f"worker{n}.log", "wb")  # noqa: SIM115 - lives with the process
        p = subprocess.Popen([sys.executable, str(SITE / "manage.py"), "aiojobqueue_worker"],
                             env=self.env, stdout=err, stderr=subprocess.STDOUT)
        err.close()
        self.workers.append(p)
        return p

    def events(self, ev: str) -> list[dict[str, Any]]:
        return [e for e in map(json.loads, self.log.read_text().splitlines()) if e["ev"] == ev]

    def wait_for(self, ev: str, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not (got := self.events(ev)):
            assert time.monotonic() < deadline, f"no {ev}\n{self.dump()}"
            time.sleep(0.05)
        return got[0]

    def dump(self) -> str:
        return "\n".join(f.read_text(errors="replace")[-3000:]
                         for f in sorted(self.tmp.glob("worker*.log")))

    def close(self) -> None:
        for p in self.workers:
            if p.poll() is None:
                p.kill()
            p.wait()


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def site(request: pytest.FixtureRequest, prefix: str, tmp_path: Path) -> Iterator[Site]:
    db = str(request.param)
    url = (f"sqlite+aiosqlite:///{tmp_path}/site.db" if db == "sqlite" else server_url(db))
    s = Site(db, prefix, tmp_path)
    try:
        yield s
    finally:
        s.close()
        import asyncio

        asyncio.run(drop_tables(url, prefix))


@pytest.mark.slow
def test_view_enqueues_and_the_worker_runs_plain_and_async_tasks(site: Site) -> None:
    ids = site.drive("view")
    w = site.worker()
    got = site.drive("results", json.dumps(ids))
    assert "timeout" not in got, site.dump()
    add, aadd, boom, ctx, fan = (got[k] for k in ("add", "aadd", "boom", "ctx", "fan"))
    assert add["status"] == "SUCCESSFUL" and add["value"]["sum"] == 5
    assert add["value"]["thread"].startswith("aiojobqueue-plain")  # a plain def: a thread
    assert add["value"]["one"] == 1  # it used Django's own connection
    assert add["attempts"] == 1 and len(add["worker_ids"]) == 1
    assert add["args"] == [2, 3] and add["task"] == "shop.tasks.add"
    assert aadd["status"] == "SUCCESSFUL" and aadd["value"] == 9
    assert aadd["kwargs"] == {"a": 4, "b": 5}
    assert boom["status"] == "FAILED" and boom["attempts"] == 2  # @task(max_attempts=2)
    assert [e["path"] for e in boom["errors"]] == ["shop.tasks.Boom"] * 2
    assert "no luck" in boom["errors"][0]["tb"]
    assert ctx["value"] == {"attempt": 1, "id": ids["ctx"], "x": 7}
    assert fan["status"] == "SUCCESSFUL" and len(fan["value"]) == 3
    parts = site.drive("results", json.dumps({str(i): i for i in fan["value"]}))
    assert sorted(r["value"] for r in parts.values()) == [0, 1, 4]
    # Django's task signals, sent by the worker around each task
    started = {e["id"] for e in site.events("signal_started")}
    finished = {(e["id"], e["status"]) for e in site.events("signal_finished")}
    assert set(ids.values()) <= started
    assert (ids["add"], "SUCCESSFUL") in finished and (ids["boom"], "FAILED") in finished
    # SIGTERM: a graceful stop, exit status 0
    w.send_signal(signal.SIGTERM)
    assert w.wait(timeout=30) == 0, site.dump()
    assert "shutting down gracefully" in site.dump()


@pytest.mark.slow
def test_a_sigkilled_workers_task_runs_again_and_finishes_once(site: Site) -> None:
    rid = site.drive("slow")["id"]
    a = site.worker()
    site.wait_for("slow_start")
    a.kill()
    a.wait()
    site.worker()
    got = site.drive("results", json.dumps({"slow": rid}))["slow"]
    assert got["status"] == "SUCCESSFUL" and got["value"] == "slept", site.dump()
    assert got["attempts"] == 2 and got["worker_ids"][0] != got["worker_ids"][1]
    assert len(site.events("slow_start")) == 2 and len(site.events("slow_end")) == 1
    assert len([e for e in site.events("signal_finished") if e["id"] == rid]) == 1


@pytest.mark.slow
def test_backend_contract_atomic_and_options(site: Site) -> None:
    got = site.drive("checks")
    # enqueue inside atomic() joins Django's transaction: a rollback takes the task along
    assert got["joined"] is True
    assert got["rolled_exists"] is False and got["kept_exists"] is True
    # validation, as django-tasks's backend tests check it
    invalid = {"InvalidTask", "InvalidTaskError"}
    for case in ("priority_high", "priority_low", "priority_float", "naive_run_after",
                 "unknown_queue", "bad_weight"):
        assert got[case] in invalid, (case, got[case])
    assert got["strict_known_queue"] is True
    assert got["missing"] == got["not_a_number"] == "TaskResultDoesNotExist"
    assert got["flags"] == [True, True, True, True]
    # queue_name -> group, Django's priority as the job's; @task(group=, weight=) kept
    assert got["aadd_job"] == {"priority": 10, "group": "emails", "type": "shop.tasks.aadd"}
    assert got["report_job"]["group"] == "reports" and got["report_job"]["weight"] == 2
    deps, first = got["depends_on"]
    assert deps == [first]
    # run_after is honoured: the task starts no earlier
    site.worker()
    d = site.drive("started_at", got["deferred"]["id"])
    assert d["status"] == "SUCCESSFUL"
    assert d["started_at"] >= got["deferred"]["run_after"] - 0.05, d

"""examples/django_site for real: its view enqueues a tenant's DAG (Django's test client),
``manage.py aiojobqueue_worker`` runs it in another process (the ``load`` task fans out),
and the results page shows every task SUCCESSFUL, ``summarize`` after ``load``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import drop_tables

SITE = Path(__file__).resolve().parents[2] / "examples" / "django_site"

DRIVE = """
import os, sys, time
sys.path.insert(0, os.getcwd())
os.environ["DJANGO_SETTINGS_MODULE"] = "site_conf.settings"
import django
django.setup()
from django.test import Client
c = Client()
if sys.argv[1] == "start":
    r = c.post("/start/acme/")
    print(r.status_code, r["Location"])
else:
    deadline = time.monotonic() + 90
    while True:
        page = c.get(sys.argv[2]).content.decode()
        if page.count("SUCCESSFUL") >= 7 or time.monotonic() > deadline:
            print(page)
            break
        time.sleep(0.2)
"""


@pytest.mark.slow
@pytest.mark.parametrize("db", ["sqlite", "postgresql"], indirect=True)
def test_django_example_runs_a_tenant_dag(db: str, db_url: str, prefix: str,
                                          tmp_path: Path) -> None:
    env = {**os.environ, "EXAMPLE_DB": db, "EXAMPLE_PREFIX": prefix,
           "EXAMPLE_SQLITE": str(tmp_path / "jobs.db")}
    if db == "sqlite":
        db_url = f"sqlite+aiosqlite:///{tmp_path}/jobs.db"

    def drive(*args: str) -> str:
        out = subprocess.run([sys.executable, "-c", DRIVE, *args], cwd=SITE, env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout

    status, where = drive("start").split()
    assert status == "302" and where.startswith("/results/?ids=")
    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115 - lives with the process
    worker = subprocess.Popen([sys.executable, "manage.py", "aiojobqueue_worker"], cwd=SITE,
                              env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        page = drive("results", where)
        rows = re.findall(r"<tr><td>(\d+)</td><td>(\w+)</td>.*?<td>(\w+)</td><td>(\d+)</td>",
                          page)
        assert sorted(r[1] for r in rows) == ["load", "score", "score", "score", "score",
                                              "score", "summarize"], page
        assert {r[2] for r in rows} == {"SUCCESSFUL"}, page
        assert "acme: loaded and scored" in page
    finally:
        worker.terminate()
        assert worker.wait(timeout=30) == 0
        log.close()
        import asyncio

        asyncio.run(drop_tables(db_url, prefix))

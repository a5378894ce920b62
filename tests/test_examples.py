"""The runnable examples run as documented."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import drop_tables

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
async def test_dynamic_dag_example(db_url: str, prefix: str) -> None:
    env = {**os.environ, "AIOJOBQUEUE_URL": db_url, "AIOJOBQUEUE_PREFIX": prefix}
    try:
        p = subprocess.run(  # noqa: ASYNC221 - the test has nothing else to do meanwhile
            [sys.executable, "examples/dynamic_dag.py"], cwd=ROOT, env=env,
            capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        lines = p.stdout.splitlines()
        assert lines[0].startswith("docs.example: 5 pages, 760 words"), p.stdout
        assert lines[1].startswith("blog.example: 3 pages, 520 words"), p.stdout
    finally:
        if not db_url.startswith("sqlite"):
            await drop_tables(db_url, prefix)

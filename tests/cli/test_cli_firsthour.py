"""What a new user meets on the command line (issue 33, items 7 and 9): the demo's hints
and event panel, ``show --traceback`` with every failed attempt, and ``status`` in an
80-column terminal."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console

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

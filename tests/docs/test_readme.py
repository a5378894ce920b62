"""The README's Python code runs as written, so it cannot rot.

Every ```python block of README.md runs as a script in a fresh process, in an empty
directory (its SQLite files land there), unless the line before it says
``<!-- readme-test: skip (reason) -->``: fragments of a file of yours (Alembic's env.py),
or code that needs what a test machine lacks. A block that defines an app is imported, never
served.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BLOCK = re.compile(r"(?:<!-- readme-test: (?P<mark>[^>]*?) -->\n)?```python\n(?P<code>.*?)```",
                   re.S)
BLOCKS = [(m["mark"], m["code"]) for m in BLOCK.finditer(README)]
RUNNABLE = [code for mark, code in BLOCKS if mark is None]


def run_block(code: str, tmp: Path, after: str = "") -> subprocess.CompletedProcess[str]:
    """The block as a script (plus ``after``, run with the block's names), in ``tmp``."""
    (tmp / "block.py").write_text(code)
    script = ("import runpy, sys\n"
              "ns = runpy.run_path('block.py', run_name='__main__')\n" + after)
    path = [str(ROOT), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    return subprocess.run([sys.executable, "-c", script], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=120)


def test_every_block_runs_or_says_why_not() -> None:
    assert len(RUNNABLE) >= 2
    for mark, _ in BLOCKS:
        if mark is not None:
            assert re.fullmatch(r"skip \(.+\)", mark), mark  # a skip always gives its reason


def test_the_in_code_snippet_runs_as_written(tmp_path: Path) -> None:
    (code,) = [c for c in RUNNABLE if "queue.batch()" in c and "asyncio.run(main())" in c]
    p = run_block(code, tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["2", "3"], p.stdout
    assert (tmp_path / "jobs.db").exists()
    again = run_block(code, tmp_path)  # a second run finds its keyed job still scheduled
    assert again.returncode == 0 and again.stdout.split() == ["2", "3"], again.stderr


def test_the_fastapi_snippet_builds_its_app(tmp_path: Path) -> None:
    (code,) = [c for c in RUNNABLE if "FastAPI(" in c]
    p = run_block(code, tmp_path, after=(
        "from fastapi import FastAPI\n"
        "assert isinstance(ns['app'], FastAPI)\n"
        "mine = ('/reports', '/jobs/{job_id}')\n"
        "print(sorted(r.path for r in ns['app'].routes if r.path in mine))\n"))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "['/jobs/{job_id}', '/reports']"


@pytest.mark.parametrize("index", range(len(RUNNABLE)))
def test_each_runnable_block_runs(index: int, tmp_path: Path) -> None:
    p = run_block(RUNNABLE[index], tmp_path)
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr


SHELL = re.findall(r"```bash\n(.*?)```", README, re.S)
# Lines the newcomer test (test_newcomer.py) runs verbatim in a fresh venv, where they belong:
# installs, the venv itself, and the two long-running processes of the FastAPI section.
NEWCOMER_ONLY = re.compile(r"^(python3 -m venv|pip install|uvicorn app:app|"
                           r"aiojobqueue worker app:queue)")


def shell_lines() -> list[str]:
    return [line.split("  #")[0].strip() for block in SHELL for line in block.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_every_shell_line_is_run_by_a_test() -> None:
    lines = shell_lines()
    assert any(line == "aiojobqueue demo" for line in lines)
    for line in lines:
        assert line.startswith(("aiojobqueue ", ". .venv/bin/activate", "python3 -m venv",
                                "pip install", "uvicorn ")), line


def test_the_safe_shell_lines_run(tmp_path: Path) -> None:
    """The README's command-line lines that change nothing outside the current directory
    (the demo, reading its database, --help), in order, in an empty directory."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    ran = 0
    for line in shell_lines():
        if NEWCOMER_ONLY.match(line) or line.startswith(". .venv/bin/activate"):
            continue
        for part in line.split("&&"):
            p = subprocess.run(part.strip(), shell=True, cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=300)
            assert p.returncode == 0, (part, p.stdout[-2000:], p.stderr[-2000:])
            assert "Traceback" not in p.stderr, p.stderr
            ran += 1
    assert ran >= 4

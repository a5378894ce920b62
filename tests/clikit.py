"""Running the command line in a fresh process, as a user would, for the CLI tests."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python -m aiojobqueue ARGS`` in a fresh process."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("AIOJOBQUEUE_")}
    full_env = {**base, "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, "-m", "aiojobqueue", *args], capture_output=True,
                          text=True, env=full_env, cwd=cwd or ROOT, timeout=timeout)


async def acli(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """``cli`` from a coroutine."""
    return await asyncio.to_thread(cli, *args, **kw)


def one_line_error(p: subprocess.CompletedProcess[str], code: int, starts: str) -> None:
    """``p`` failed with ``code`` and one line on stderr starting ``error: starts``."""
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {starts}"), p.stderr

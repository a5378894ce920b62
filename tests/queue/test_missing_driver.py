"""A missing database driver is a MissingDriverError (a ConfigurationError and an
ImportError) that says which extra to install, from JobQueue, SyncQueue and the command line
alike (issue 33, item 4). Each case runs in a fresh interpreter where the driver cannot be
imported (a ``sys.meta_path`` finder refuses it), the real package otherwise."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import asyncio, importlib.abc, json, sys
    blocked, kind, url = sys.argv[1].split(","), sys.argv[2], sys.argv[3]

    class Blocker(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in blocked:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Blocker())
    import aiojobqueue
    from aiojobqueue import JobQueue, SyncQueue

    async def use_async():
        async with JobQueue(url, prefix="t_nodriver_"):
            pass

    try:
        if kind == "async":
            asyncio.run(use_async())
        elif kind == "sync":
            with SyncQueue(url, prefix="t_nodriver_") as q:
                q.enqueue("x")
        else:
            from aiojobqueue.cli import main
            sys.argv = ["aiojobqueue", "status", "--url", url]
            main()
        out = {"raised": None}
    except SystemExit as exc:
        out = {"raised": "SystemExit", "code": exc.code}
    except BaseException as exc:
        out = {"raised": type(exc).__name__, "message": str(exc),
               "config": isinstance(exc, aiojobqueue.ConfigurationError),
               "import": isinstance(exc, ImportError)}
    print(json.dumps(out))
""")

PG = "postgresql://postgres@127.0.0.1:5432/test"
MY = "mysql://root@127.0.0.1:3306/test"
CASES = [
    ("asyncpg", "async", PG, '"aiojobqueue[postgresql]"'),
    ("aiomysql,pymysql", "async", MY, '"aiojobqueue[mysql]"'),
    ("psycopg", "async", "postgresql+psycopg://postgres@127.0.0.1:5432/test",
     '"aiojobqueue[postgresql-psycopg]"'),
    ("psycopg", "sync", PG, '"aiojobqueue[postgresql-sync]"'),
    ("pymysql", "sync", MY, '"aiojobqueue[mysql-sync]"'),
]


def _run(blocked: str, kind: str, url: str) -> tuple[dict[str, object], str]:
    p = subprocess.run([sys.executable, "-c", SCRIPT, blocked, kind, url],
                       capture_output=True, text=True, timeout=60)
    lines = p.stdout.strip().splitlines()
    assert lines, p.stderr
    return json.loads(lines[-1]), p.stdout + p.stderr


@pytest.mark.parametrize(("blocked", "kind", "url", "extra"), CASES,
                         ids=[f"{k}-{b}" for b, k, _, _ in CASES])
def test_missing_driver_names_the_extra(blocked: str, kind: str, url: str, extra: str) -> None:
    out, _ = _run(blocked, kind, url)
    assert out["raised"] == "MissingDriverError", out
    assert out["config"] and out["import"]
    name = blocked.split(",")[0]
    assert f"driver {name} is not installed" in str(out["message"])
    assert str(out["message"]).endswith(f"pip install {extra}"), out


def test_the_command_line_says_the_same() -> None:
    out, text = _run("asyncpg", "cli", PG)
    assert out == {"raised": "SystemExit", "code": 2}, text
    assert 'pip install "aiojobqueue[postgresql]"' in text


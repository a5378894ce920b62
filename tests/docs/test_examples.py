"""The runnable examples run as documented, and use only what a user may use."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import drop_tables

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").rglob("*.py"))


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


def private_reach(path: Path, root: Path = ROOT) -> list[str]:
    """``obj._name`` in a file (dunders aside): what a user copying it must not rely on."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not (
            node.attr.startswith("__") and node.attr.endswith("__")
        ):
            found.append(f"{path.relative_to(root)}:{node.lineno}: .{node.attr}")
    return found


def test_examples_use_only_the_public_api() -> None:
    assert len(EXAMPLES) >= 6
    assert [hit for path in EXAMPLES for hit in private_reach(path)] == []


def test_private_reach_is_found(tmp_path: Path) -> None:
    f = tmp_path / "x.py"
    f.write_text("import os\nif 'a' not in queue._handlers:\n    print(os.__name__)\n")
    assert private_reach(f, tmp_path) == ["x.py:2: ._handlers"]


def test_examples_install_only_what_they_need() -> None:
    """No example asks for the development extra (mypy, matplotlib…) to get its own
    dependencies; the FastAPI one names them."""
    for path in EXAMPLES:
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert ".[dev]" not in doc, path
    doc = ast.get_docstring(ast.parse((ROOT / "examples" / "fastapi_app.py").read_text()))
    assert doc is not None and 'pip install "aiojobqueue[web]" fastapi uvicorn' in doc

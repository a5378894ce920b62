"""Alembic users: ``alembic revision --autogenerate`` against a database the queue created
finds nothing to change in the queue's tables (``aiojobqueue.metadata`` / ``build_tables``
in ``target_metadata``), so no migration of the user's app carries a spurious step for
them. Runs Alembic's own comparison, with its default options, on every database, and a
real ``alembic revision --autogenerate`` in the example project (examples/alembic)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import MetaData, Table, inspect

from aiojobqueue import JobQueue
from aiojobqueue.dialects.urls import sync_url
from aiojobqueue.schema import build_tables, include_object

alembic = pytest.importorskip("alembic", reason="Alembic is a dev dependency")
from alembic.autogenerate import compare_metadata  # noqa: E402
from alembic.migration import MigrationContext  # noqa: E402


async def test_autogenerate_finds_no_difference_in_a_queue_created_database(
    queue: JobQueue,
) -> None:
    prefix = queue.prefix
    target = build_tables(prefix).metadata

    def only_ours(name: str | None, type_: str, parent_names: Any) -> bool:
        # the test database holds other tests' tables: compare this queue's only
        return type_ != "table" or (name or "").startswith(prefix)

    def compare(conn: Any) -> list[Any]:
        ctx = MigrationContext.configure(conn, opts={
            "compare_type": True, "include_name": only_ours, "include_object": include_object})
        return list(compare_metadata(ctx, target))

    async with queue.engine.connect() as conn:
        diff = await conn.run_sync(compare)
    assert diff == []
    # the comparison sees the queue's tables (an empty diff is not a blind one)
    async with queue.engine.connect() as conn:
        names = await conn.run_sync(
            lambda c: [t for t in inspect(c).get_table_names() if t.startswith(prefix)])
    assert set(names) == set(target.tables)


# -- a real Alembic project: examples/alembic -------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]


def upgrade_ops(script: Path) -> list[str]:
    """The ``op.`` calls in a generated migration's upgrade()."""
    text = script.read_text()
    body = text.split("def upgrade() -> None:", 1)[1].split("def downgrade", 1)[0]
    return [line.strip() for line in body.splitlines() if line.strip().startswith("op.")]


async def test_alembic_revision_autogenerate_in_the_example_project(
    queue: JobQueue, db_url: str, prefix: str, tmp_path: Path
) -> None:
    """examples/alembic against a database the queue created: the app's first migration
    creates only the app's table; after it, autogenerate writes an empty migration; a change
    to the app's model, and one to the queue's tables, are each found."""
    project = tmp_path / "project"
    shutil.copytree(ROOT / "examples" / "alembic", project)
    app_prefix = f"{prefix}app_"
    env = {**os.environ, "DATABASE_URL": sync_url(db_url), "AIOJOBQUEUE_PREFIX": prefix,
           "APP_PREFIX": app_prefix, "PYTHONPATH": str(ROOT)}

    def alembic(*args: str) -> Path | None:
        before = set((project / "migrations" / "versions").glob("*.py"))
        p = subprocess.run(
            [sys.executable, "-m", "alembic", "-c", str(project / "alembic.ini"), *args],
            cwd=project, env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        made = set((project / "migrations" / "versions").glob("*.py")) - before
        return made.pop() if made else None

    try:
        first = alembic("revision", "--autogenerate", "-m", "init")
        assert first is not None
        ops = upgrade_ops(first)
        assert any(f"'{app_prefix}notes'" in op for op in ops), ops
        assert not any(prefix + "jobs" in op or "ix_ready" in op for op in ops), ops
        alembic("upgrade", "head")

        same = alembic("revision", "--autogenerate", "-m", "nothing")
        assert same is not None and upgrade_ops(same) == []
        same.unlink()

        # a real change to the app's model is found (the comparison is not blind) ...
        models = project / "models.py"
        models.write_text(models.read_text().replace(
            '    Column("title", String(200), nullable=False),\n',
            '    Column("title", String(200), nullable=False),\n'
            '    Column("body", String(500)),\n'))
        changed = alembic("revision", "--autogenerate", "-m", "body")
        assert changed is not None
        ops = upgrade_ops(changed)
        assert len(ops) == 1 and "add_column" in ops[0] and "'body'" in ops[0], ops
        changed.unlink()
        # ... and so is one to the queue's tables: an index gone from the database
        tables = build_tables(prefix)
        ix_ready = next(ix for ix in tables.jobs.indexes if ix.name == f"{prefix}ix_ready")
        async with queue.engine.begin() as conn:
            await conn.run_sync(ix_ready.drop)
        gone = alembic("revision", "--autogenerate", "-m", "index")
        assert gone is not None
        ops = upgrade_ops(gone)
        assert any("create_index" in op and f"{prefix}ix_ready" in op for op in ops), ops
    finally:
        if not db_url.startswith("sqlite"):
            async with queue.engine.begin() as conn:
                for name in (f"{app_prefix}notes", f"{app_prefix}alembic_version"):
                    await conn.run_sync(
                        lambda c, n=name: Table(n, MetaData()).drop(c, checkfirst=True))

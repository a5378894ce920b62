"""Alembic users: ``alembic revision --autogenerate`` against a database the queue created
finds nothing to change in the queue's tables (``aiojobqueue.metadata`` / ``build_tables``
in ``target_metadata``), so no migration of the user's app carries a spurious step for
them. Runs Alembic's own comparison, with its default options, on every database."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import inspect

from aiojobqueue import JobQueue
from aiojobqueue.schema import build_tables

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
        ctx = MigrationContext.configure(
            conn, opts={"compare_type": True, "include_name": only_ours})
        return list(compare_metadata(ctx, target))

    async with queue.engine.connect() as conn:
        diff = await conn.run_sync(compare)
        if conn.dialect.name == "mysql":
            # ix_waiting exists only where indexes can be partial (schema.waiting_index);
            # Alembic does not read ddl_if, so it proposes it here (the README says so)
            diff = [d for d in diff if not (d[0] == "add_index"
                                            and d[1].name == f"{prefix}ix_waiting")]
    assert diff == []
    # the comparison sees the queue's tables (an empty diff is not a blind one)
    async with queue.engine.connect() as conn:
        names = await conn.run_sync(
            lambda c: [t for t in inspect(c).get_table_names() if t.startswith(prefix)])
    assert set(names) == set(target.tables)

"""What a test reads of the database's side of an operation: the rows a call left, and
the statements it sent."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event, func, select

from aiojobqueue import JobQueue


async def counts(q: JobQueue) -> tuple[int, int]:
    """(rows in jobs, rows in deps): bad input must leave both unchanged."""
    J, D = q._t.jobs, q._t.deps

    async def read(conn: Any) -> tuple[int, int]:
        nj = (await conn.execute(select(func.count()).select_from(J))).scalar_one()
        nd = (await conn.execute(select(func.count()).select_from(D))).scalar_one()
        return int(nj), int(nd)

    return await q._read(read)


@contextmanager
def count_statements(q: JobQueue) -> Iterator[list[str]]:
    """Collect every statement sent to the database while the block runs."""
    seen: list[str] = []

    def on_execute(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    engine = q.engine.sync_engine
    event.listen(engine, "before_cursor_execute", on_execute)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", on_execute)

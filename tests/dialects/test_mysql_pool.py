"""MySQL/MariaDB connections going back to the pool: a ROLLBACK only where the server says
a transaction is open (dialects/mysql.py, _reset_open_transaction). The pool's own reset
sent one after every COMMIT: a round trip per transaction for nothing."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from aiojobqueue import JobQueue

pytestmark = pytest.mark.parametrize("db", ["mariadb"], indirect=True)


@pytest_asyncio.fixture
async def engine(make_queue: Callable[..., JobQueue]) -> AsyncIterator[AsyncEngine]:
    """A started queue's engine on MariaDB, of one connection (every checkout is the same
    server session)."""
    q = make_queue(pool_size=1)
    async with q:
        yield q.engine


async def _rollbacks(engine: AsyncEngine) -> int:
    """The session's ROLLBACKs so far (this read's own is counted by the next one)."""
    async with engine.connect() as conn:
        row = (await conn.execute(text("SHOW SESSION STATUS LIKE 'Com_rollback'"))).one()
        return int(row[1])


async def test_a_committed_transaction_is_not_rolled_back_at_checkin(engine: AsyncEngine
                                                                     ) -> None:
    before = await _rollbacks(engine)
    for _ in range(10):
        async with engine.begin() as conn:
            await conn.execute(text("SELECT 1"))
    # the only ROLLBACK since: the one ending the read of `before` (a read's transaction)
    assert await _rollbacks(engine) - before == 1


async def test_a_transaction_left_open_is_rolled_back_at_checkin(engine: AsyncEngine) -> None:
    """A driver connection returned with a write in flight: the reset rolls it back, so the
    next checkout neither sees nor commits it."""
    table = f"t{uuid.uuid4().hex[:8]}"
    async with engine.begin() as conn:
        await conn.execute(text(f"CREATE TABLE {table} (x INT) ENGINE=InnoDB"))
    try:
        def write_behind_sqlalchemy(sync: Any) -> bool:
            cur = sync.connection.cursor()  # the DBAPI cursor: SQLAlchemy sees no transaction
            cur.execute(f"INSERT INTO {table} VALUES (1)")
            cur.close()
            return bool(sync.connection.driver_connection.get_transaction_status())

        async with engine.connect() as conn:
            assert await conn.run_sync(write_behind_sqlalchemy)
        async with engine.begin() as conn:
            n = (await conn.execute(text(f"SELECT COUNT(*) FROM {table}"))).scalar_one()
        assert n == 0
    finally:
        async with engine.begin() as conn:
            await conn.execute(text(f"DROP TABLE {table}"))

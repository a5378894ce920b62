"""Create or upgrade the schema in place, safely when several workers start at once."""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, update
from sqlalchemy.exc import DBAPIError

from .errors import SchemaError
from .schema import SCHEMA_VERSION

if TYPE_CHECKING:
    from .queue import JobQueue


async def current_version(q: JobQueue) -> int | None:
    """The schema version stored in the database, or None if there is no schema."""
    M = q._t.meta

    def has_meta(sync_conn: Any) -> bool:
        from sqlalchemy import inspect

        return bool(inspect(sync_conn).has_table(M.name))

    async with q.engine.connect() as conn:
        if not await conn.run_sync(has_meta):
            return None
        v = (await conn.execute(select(M.c.value).where(M.c.name == "schema_version"))).scalar()
        return int(v) if v is not None else None


async def check(q: JobQueue) -> int:
    """Raise SchemaError unless the schema exists at SCHEMA_VERSION; changes nothing."""
    found = await current_version(q)
    where = f"tables prefixed {q.prefix!r}"
    if found is None:
        raise SchemaError(f"no aiojobqueue schema ({where}) in this database; "
                          "create it with `aiojobqueue migrate`")
    if found < SCHEMA_VERSION:
        raise SchemaError(f"the aiojobqueue schema ({where}) is version {found}, this "
                          f"aiojobqueue needs {SCHEMA_VERSION}: run `aiojobqueue migrate`")
    if found > SCHEMA_VERSION:
        raise SchemaError(f"the aiojobqueue schema ({where}) is version {found}, newer than "
                          f"this aiojobqueue ({SCHEMA_VERSION}): upgrade aiojobqueue")
    return found


async def upgrade(q: JobQueue) -> int:
    """Bring the schema to SCHEMA_VERSION. Returns the version found before (0: none)."""
    for attempt in range(5):
        try:
            return await _upgrade_once(q)
        except DBAPIError:
            # Another process created the same tables at the same moment; look again.
            if attempt == 4:
                raise
            await asyncio.sleep(0.1 + random.random() * 0.3)
    raise AssertionError("unreachable")


async def _upgrade_once(q: JobQueue) -> int:
    M = q._t.meta
    async with q.engine.connect() as conn:
        await q._ops.check_server(conn)
    found = await current_version(q) or 0
    if found > SCHEMA_VERSION:
        raise SchemaError(
            f"the database schema is version {found}, newer than this aiojobqueue "
            f"({SCHEMA_VERSION}): upgrade aiojobqueue"
        )
    if found == SCHEMA_VERSION:
        return found
    async with q.engine.begin() as conn:
        await conn.run_sync(q._t.metadata.create_all, checkfirst=True)
    async with q.engine.begin() as conn:
        have = {r[0] for r in await conn.execute(select(M.c.name))}
        rows = [{"name": n, "value": v} for n, v in
                (("schema_version", str(SCHEMA_VERSION)), ("gate", "claims"))
                if n not in have]
        if rows:
            await q._ops.insert_ignore(conn, M, rows)
        # future versions: per-version steps go here, before the version is bumped
        await conn.execute(
            update(M).where(M.c.name == "schema_version").values(value=str(SCHEMA_VERSION))
        )
    return found

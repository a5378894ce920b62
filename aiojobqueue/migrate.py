"""Create or upgrade the schema in place, safely when several workers start at once."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import TYPE_CHECKING, Any

from sqlalchemy import select, text, update
from sqlalchemy.exc import DBAPIError

from .errors import SchemaError
from .schema import ACTIVE, CONTAINER, CREDIT, SCHEMA_VERSION, WAITING, v2_indexes

if TYPE_CHECKING:
    from .queue import JobQueue

log = logging.getLogger("aiojobqueue.migrate")


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
    if 0 < found < 2:
        await _v1_to_v2(q)
    if 0 < found < 3:
        await _v2_to_v3(q)
    if 0 < found < 4:
        await _v3_to_v4(q)
    if 0 < found < 6:
        await _v5_to_v6(q)
    async with q.engine.begin() as conn:
        await conn.run_sync(q._t.metadata.create_all, checkfirst=True)
    async with q.engine.begin() as conn:
        have = {r[0] for r in await conn.execute(select(M.c.name))}
        rows = [{"name": n, "value": v} for n, v in
                (("schema_version", str(SCHEMA_VERSION)), ("gate", "claims"))
                if n not in have]
        if rows:
            await q._ops.insert_ignore(conn, M, rows)
        await conn.execute(
            update(M).where(M.c.name == "schema_version").values(value=str(SCHEMA_VERSION))
        )
    return found


async def _v1_to_v2(q: JobQueue) -> None:
    """v2: the ``has_dependents`` flag (filled from the edges) and three partial indexes."""
    J, D = q._t.jobs, q._t.deps
    async with q.engine.begin() as conn:
        await q._ops.lock_gate(conn)  # one process migrates; the others wait, then see v2

        def columns(sync_conn: Any) -> set[str]:
            from sqlalchemy import inspect

            return {c["name"] for c in inspect(sync_conn).get_columns(J.name)}

        if "has_dependents" not in await conn.run_sync(columns):
            await conn.execute(text(
                f"ALTER TABLE {J.name} ADD COLUMN has_dependents BOOLEAN NOT NULL DEFAULT false"))
        await conn.execute(
            update(J).where(J.c.id.in_(select(D.c.depends_on_id).distinct()))
            .values(has_dependents=True)
        )
        if conn.dialect.name != "mysql":  # MySQL has no partial indexes: nothing changes
            names = {ix.name for ix in v2_indexes(q.prefix)}
            redo = sorted((ix for ix in J.indexes if ix.name in names), key=str)

            def recreate(sync_conn: Any) -> None:
                for ix in redo:
                    ix.drop(sync_conn, checkfirst=True)
                    ix.create(sync_conn)

            await conn.run_sync(recreate)


async def _v2_to_v3(q: JobQueue) -> None:
    """v3: a container not yet active holds its waiting children with ``CREDIT`` in their
    ``pending`` (was 1). Not idempotent, so the version moves to 3 in the same transaction,
    and a process that waited for the lock finds it done."""
    J, M = q._t.jobs, q._t.meta
    async with q.engine.begin() as conn:
        await q._ops.lock_gate(conn)
        v = (await conn.execute(select(M.c.value).where(M.c.name == "schema_version"))).scalar()
        if v is None or int(v) >= 3:
            return
        # the inner derived table: MySQL cannot otherwise read the table it updates
        closed = select(J.c.id).where(J.c.kind == CONTAINER, J.c.state != ACTIVE).subquery()
        await conn.execute(
            update(J).where(J.c.state == WAITING,
                            J.c.parent_id.in_(select(closed.c.id)), J.c.pending < CREDIT)
            .values(pending=J.c.pending + (CREDIT - 1))
        )
        await conn.execute(update(M).where(M.c.name == "schema_version").values(value="3"))


async def _v3_to_v4(q: JobQueue) -> None:
    """v4: ``live_key`` is unique through the index ``<prefix>ux_live_key`` (see
    schema.live_key_index), partial on PostgreSQL and SQLite, instead of through a UNIQUE
    constraint on the column. The rule (no two live jobs share a key) holds throughout.

    * PostgreSQL: the old constraint, found in the catalog by its one column (whatever its
      name), is dropped and the index built in one transaction, so no other session ever
      sees the table with neither. The drop goes first: it takes the table's exclusive lock
      at once instead of upgrading to it from the build's SHARE lock (an upgrade deadlocks
      with a session that read the table and then writes to it). Writes to the jobs table
      wait while the index is built (one scan; only live keyed jobs get an entry).
    * MySQL/MariaDB: one ALTER TABLE swaps the old unique key (named after the column,
      found in information_schema) for the new one, which is not partial there (InnoDB's
      unique index allows any number of NULLs): the same rule, renamed so that the database
      matches the metadata (Alembic). DDL commits implicitly there, which lets go of the
      gate too: a process that takes it next and still sees the old key fails its ALTER and
      upgrade() tries again, finding v4.
    * SQLite: an inline UNIQUE constraint goes only with a rebuild of the table (every row
      copied under the write lock), so an existing file keeps it: it enforces exactly the
      same rule, with an entry for every row as before; a new file gets the partial index.

    Also ``ix_ready_weight`` (PostgreSQL, SQLite) is rebuilt to hold only ready jobs heavier
    than the default weight (schema.ready_weight_index): the census reads a group with
    ready jobs and no entry as weight 1.

    The version moves to 4 in the same transaction (on MySQL/MariaDB, right after the
    ALTER); a process that waited for the lock finds it done."""
    J, M = q._t.jobs, q._t.meta
    ux = next(ix for ix in J.indexes if ix.name == f"{q.prefix}ux_live_key")
    async with q.engine.begin() as conn:
        await q._ops.lock_gate(conn)
        v = (await conn.execute(select(M.c.value).where(M.c.name == "schema_version"))).scalar()
        if v is None or int(v) >= 4:
            return
        quote = conn.dialect.identifier_preparer.quote
        table = conn.dialect.identifier_preparer.format_table(J)
        if conn.dialect.name == "postgresql":
            old = (await conn.execute(text("""
                SELECT c.conname FROM pg_constraint c
                JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
                WHERE c.conrelid = to_regclass(:t) AND c.contype = 'u'
                  AND cardinality(c.conkey) = 1 AND a.attname = 'live_key'"""),
                {"t": table})).scalars().all()
            for name in old:
                await conn.execute(text(f"ALTER TABLE {table} DROP CONSTRAINT {quote(name)}"))
            await conn.run_sync(ux.create, checkfirst=True)
        elif conn.dialect.name == "mysql":
            have = (await conn.execute(text("""
                SELECT INDEX_NAME FROM information_schema.STATISTICS
                WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = :t AND NON_UNIQUE = 0
                GROUP BY INDEX_NAME
                HAVING COUNT(*) = 1 AND MAX(COLUMN_NAME) = 'live_key'"""),
                {"t": J.name})).scalars().all()
            changes = [f"DROP INDEX {quote(name)}" for name in have if name != ux.name]
            if ux.name not in have:
                changes.append(f"ADD UNIQUE INDEX {quote(str(ux.name))} (live_key)")
            if changes:
                await conn.execute(text(f"ALTER TABLE {table} {', '.join(changes)}"))
        if conn.dialect.name != "mysql":  # MySQL has no partial indexes: nothing changes
            weight = next(ix for ix in J.indexes if ix.name == f"{q.prefix}ix_ready_weight")

            def recreate(sync_conn: Any) -> None:
                weight.drop(sync_conn, checkfirst=True)
                weight.create(sync_conn)

            await conn.run_sync(recreate)
        await conn.execute(update(M).where(M.c.name == "schema_version").values(value="4"))


async def _v5_to_v6(q: JobQueue) -> None:
    """v6: nullable columns for observability: ``progress`` and ``errors`` on jobs;
    ``types``, ``capacity`` and ``config`` on workers. A nullable column without a default
    rewrites no row on any of the three databases; each is added only if missing."""
    async with q.engine.begin() as conn:
        await q._ops.lock_gate(conn)
        for table, names in ((q._t.jobs, ("progress", "errors")),
                             (q._t.workers, ("types", "capacity", "config"))):
            def columns(sync_conn: Any, name: str = table.name) -> set[str]:
                from sqlalchemy import inspect

                return {c["name"] for c in inspect(sync_conn).get_columns(name)}

            have = await conn.run_sync(columns)
            for name in names:
                if name not in have:
                    kind = table.c[name].type.compile(dialect=conn.dialect)
                    await conn.execute(text(f"ALTER TABLE {table.name} ADD COLUMN {name} {kind}"))


async def settle_routine(q: JobQueue, create: bool) -> tuple[Any, Any, Any] | None:
    """The calls of the dialect's one-call finalize routines (see
    Completer.finish_in_one_call), creating them if they are missing and ``create``; None
    where the dialect has none, or they are missing and may not be created (the long path
    and its plain statements are used then: the same effect, more round trips). Their
    names carry a digest of their text, so an aiojobqueue whose statements changed installs
    (and uses) its own."""
    spec = q._completer.settle_routine()
    if spec is None:
        return None
    name, ddl = spec
    async with q.engine.connect() as conn:
        there = await q._ops.routine_exists(conn, name)
    if not there and not create:
        log.info("the routine %s is missing (run `aiojobqueue migrate`): finalizing jobs "
                 "that others depend on takes more round trips", name)
        return None
    if not there:
        async with q.engine.begin() as conn:
            await q._ops.lock_gate(conn)  # one process creates them; the others then see them
            if not await q._ops.routine_exists(conn, name):
                for statement in ddl:
                    await conn.exec_driver_sql(statement)
    return q._ops.settle_calls(name)

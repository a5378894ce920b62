"""Create or upgrade the schema in place, safely when several workers start at once. The
one-call finalize routines are installed by finalize_routines.py."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from sqlalchemy import select, text, update
from sqlalchemy.exc import DBAPIError

from .database import Database
from .errors import SchemaError
from .schema import (
    ACTIVE,
    CONTAINER,
    CREDIT,
    SCHEMA_VERSION,
    WAITING,
    overview_indexes,
    running_indexes,
    v2_indexes,
)


async def current_version(db: Database) -> int | None:
    """The schema version stored in the database, or None if there is no schema."""
    M = db.t.meta

    def has_meta(sync_conn: Any) -> bool:
        from sqlalchemy import inspect

        return bool(inspect(sync_conn).has_table(M.name))

    async with db.engine.connect() as conn:
        if not await conn.run_sync(has_meta):
            return None
        v = (await conn.execute(select(M.c.value).where(M.c.name == "schema_version"))).scalar()
        return int(v) if v is not None else None


def _prefix(db: Database) -> str:
    return db.t.jobs.name.removesuffix("jobs")


async def check(db: Database) -> int:
    """Raise SchemaError unless the schema exists at SCHEMA_VERSION; changes nothing."""
    found = await current_version(db)
    where = f"tables prefixed {_prefix(db)!r}"
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


async def upgrade(db: Database) -> int:
    """Bring the schema to SCHEMA_VERSION. Returns the version found before (0: none)."""
    for attempt in range(5):
        try:
            return await _upgrade_once(db)
        except DBAPIError:
            # Another process created the same tables at the same moment; look again.
            if attempt == 4:
                raise
            await asyncio.sleep(0.1 + random.random() * 0.3)
    raise AssertionError("unreachable")


async def _upgrade_once(db: Database) -> int:
    M = db.t.meta
    async with db.engine.connect() as conn:
        await db.ops.check_server(conn)
    found = await current_version(db) or 0
    if found > SCHEMA_VERSION:
        raise SchemaError(
            f"the database schema is version {found}, newer than this aiojobqueue "
            f"({SCHEMA_VERSION}): upgrade aiojobqueue"
        )
    if found == SCHEMA_VERSION:
        return found
    if 0 < found < 2:
        await _v1_to_v2(db)
    if 0 < found < 3:
        await _v2_to_v3(db)
    if 0 < found < 4:
        await _v3_to_v4(db)
    if 0 < found < 6:
        await _v5_to_v6(db)
    if 0 < found < 7:
        await _v6_to_v7(db)
    if 0 < found < 8:
        await _v7_to_v8(db)
    if 0 < found < 9:
        await _v8_to_v9(db)
    if 0 < found < 10:
        await _v9_to_v10_jobs(db)
        await _v9_to_v10_ops_schedules(db)
    async with db.engine.begin() as conn:
        await conn.run_sync(db.t.metadata.create_all, checkfirst=True)
    async with db.engine.begin() as conn:
        have = {r[0] for r in await conn.execute(select(M.c.name))}
        rows = [{"name": n, "value": v} for n, v in
                (("schema_version", str(SCHEMA_VERSION)), ("gate", "claims"))
                if n not in have]
        if rows:
            await db.ops.insert_ignore(conn, M, rows)
        await conn.execute(
            update(M).where(M.c.name == "schema_version").values(value=str(SCHEMA_VERSION))
        )
    return found


async def _v1_to_v2(db: Database) -> None:
    """v2: the ``has_dependents`` flag (filled from the edges) and three partial indexes."""
    J, D = db.t.jobs, db.t.deps
    async with db.engine.begin() as conn:
        await db.ops.lock_gate(conn)  # one process migrates; the others wait, then see v2

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
        if db.ops.partial_indexes():  # else nothing changes
            names = {ix.name for ix in v2_indexes(_prefix(db))}
            redo = sorted((ix for ix in J.indexes if ix.name in names), key=str)

            def recreate(sync_conn: Any) -> None:
                for ix in redo:
                    ix.drop(sync_conn, checkfirst=True)
                    ix.create(sync_conn)

            await conn.run_sync(recreate)


async def _v2_to_v3(db: Database) -> None:
    """v3: a container not yet active holds its waiting children with ``CREDIT`` in their
    ``pending`` (was 1). Not idempotent, so the version moves to 3 in the same transaction,
    and a process that waited for the lock finds it done."""
    J, M = db.t.jobs, db.t.meta
    async with db.engine.begin() as conn:
        await db.ops.lock_gate(conn)
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


async def _v3_to_v4(db: Database) -> None:
    """v4: ``live_key`` is unique through the index ``<prefix>ux_live_key`` (see
    schema.live_key_index), partial on PostgreSQL and SQLite, instead of through a UNIQUE
    constraint on the column. The rule (no two live jobs share a key) holds throughout.

    How is each dialect's (DialectOps.upgrade_live_key): PostgreSQL swaps the constraint
    for the index in one transaction; MySQL/MariaDB in one ALTER TABLE (not partial there);
    SQLite: an inline UNIQUE constraint goes only with a rebuild of the table (every row
      copied under the write lock), so an existing file keeps it: it enforces exactly the
      same rule, with an entry for every row as before; a new file gets the partial index.

    Also ``ix_ready_weight`` (PostgreSQL, SQLite) is rebuilt to hold only ready jobs heavier
    than the default weight (schema.ready_weight_index): the census reads a group with
    ready jobs and no entry as weight 1.

    The version moves to 4 in the same transaction (on MySQL/MariaDB, right after the
    ALTER); a process that waited for the lock finds it done."""
    J, M = db.t.jobs, db.t.meta
    prefix = _prefix(db)
    ux = next(ix for ix in J.indexes if ix.name == f"{prefix}ux_live_key")
    async with db.engine.begin() as conn:
        await db.ops.lock_gate(conn)
        v = (await conn.execute(select(M.c.value).where(M.c.name == "schema_version"))).scalar()
        if v is None or int(v) >= 4:
            return
        await db.ops.upgrade_live_key(conn, ux)
        if db.ops.partial_indexes():  # else nothing changes
            weight = next(ix for ix in J.indexes if ix.name == f"{prefix}ix_ready_weight")

            def recreate(sync_conn: Any) -> None:
                weight.drop(sync_conn, checkfirst=True)
                weight.create(sync_conn)

            await conn.run_sync(recreate)
        await conn.execute(update(M).where(M.c.name == "schema_version").values(value="4"))


async def _v5_to_v6(db: Database) -> None:
    """v6: nullable columns for observability: ``progress`` and ``errors`` on jobs;
    ``types``, ``capacity`` and ``config`` on workers. A nullable column without a default
    rewrites no row on any of the three databases; each is added only if missing."""
    async with db.engine.begin() as conn:
        await db.ops.lock_gate(conn)  # one process migrates; the others wait, then see v6
        for table, names in ((db.t.jobs, ("progress", "errors")),
                             (db.t.workers, ("types", "capacity", "config"))):
            def columns(sync_conn: Any, name: str = table.name) -> set[str]:
                from sqlalchemy import inspect

                return {c["name"] for c in inspect(sync_conn).get_columns(name)}

            have = await conn.run_sync(columns)
            for name in names:
                if name not in have:
                    kind = table.c[name].type.compile(dialect=conn.dialect)
                    await conn.execute(text(f"ALTER TABLE {table.name} ADD COLUMN {name} {kind}"))


async def _v6_to_v7(db: Database) -> None:
    """v7: the nullable ``trace`` column on jobs (the W3C trace context that
    aiojobqueue.tracing stores with a traced enqueue; no row is rewritten) and, on
    PostgreSQL and SQLite, the dashboard's and the waiting gauge's partial indexes
    (schema.overview_indexes; each a pass over the table, the rows indexed few). Each is
    added only if missing, under the gate's lock (one process migrates; the others wait,
    then find them)."""
    J = db.t.jobs
    names = {ix.name for ix in overview_indexes(_prefix(db))}
    todo = sorted((ix for ix in J.indexes if ix.name in names), key=str)
    async with db.engine.begin() as conn:
        await db.ops.lock_gate(conn)

        def columns(sync_conn: Any) -> set[str]:
            from sqlalchemy import inspect

            return {c["name"] for c in inspect(sync_conn).get_columns(J.name)}

        if "trace" not in await conn.run_sync(columns):
            kind = J.c.trace.type.compile(dialect=conn.dialect)
            await conn.execute(text(f"ALTER TABLE {J.name} ADD COLUMN trace {kind}"))
        if db.ops.partial_indexes():
            def create(sync_conn: Any) -> None:
                for ix in todo:
                    ix.create(sync_conn, checkfirst=True)

            await conn.run_sync(create)


async def _v7_to_v8(db: Database) -> None:
    """v8: ``starts`` on the rate ledger (``INTEGER NOT NULL DEFAULT 1``): a claim records
    its starts in one row instead of one row each. The rows already there count one each,
    as they did. A constant default rewrites no row on any of the three databases (the
    value is kept in the catalog). ``ix_rate`` is rebuilt with ``starts`` (the budget's
    SUM reads the index alone; the ledger holds seconds of rows, so this is quick). Each
    only if missing, under the gate's lock (one process migrates; the others wait, then
    find them)."""
    R = db.t.rate
    ix = next(i for i in R.indexes if i.name == f"{_prefix(db)}ix_rate")
    async with db.engine.begin() as conn:
        await db.ops.lock_gate(conn)

        def seen(sync_conn: Any) -> tuple[set[str], list[str] | None] | None:
            from sqlalchemy import inspect

            look = inspect(sync_conn)
            if not look.has_table(R.name):
                return None  # create_all makes it, with the column and the index
            cols = {c["name"] for c in look.get_columns(R.name)}
            found = [i for i in look.get_indexes(R.name) if i["name"] == ix.name]
            return cols, ([str(c) for c in found[0]["column_names"]] if found else None)

        have = await conn.run_sync(seen)
        if have is None:
            return
        cols, indexed = have
        if "starts" not in cols:
            await conn.execute(text(
                f"ALTER TABLE {R.name} ADD COLUMN starts INTEGER NOT NULL DEFAULT 1"))
        if indexed != ["name", "at", "starts"]:
            def rebuild(sync_conn: Any) -> None:
                if indexed is not None:
                    ix.drop(sync_conn)
                ix.create(sync_conn)

            await conn.run_sync(rebuild)


async def _v8_to_v9(db: Database) -> None:
    """v9: the ``leased`` state (a job leased ahead into a slot its worker holds under a
    counted cap: see slots.Slots.take_over) and its index ``ix_leased`` (state,
    lease_owner, lease_expires; partial where the dialect has them). ``state`` is a plain
    string column (no CHECK), so no row changes; the index is added only if missing, under
    the gate's lock (one process migrates; the others wait, then find it). Workers of
    v8 never lease into this state, and do not reclaim rows in it: upgrade the fleet's
    workers together."""
    J = db.t.jobs
    ix = next(i for i in J.indexes if i.name == f"{_prefix(db)}ix_leased")
    async with db.engine.begin() as conn:
        await db.ops.lock_gate(conn)
        await conn.run_sync(lambda sync_conn: ix.create(sync_conn, checkfirst=True))


async def _v9_to_v10_jobs(db: Database) -> None:
    """v10: on jobs, the ``releases`` count (``Job.releases``: attempts given back without an
    outcome) and the ``snoozes`` count (``Snooze``), NOT NULL DEFAULT 0, and the ``external``
    state's index ``ix_external``; each added only if missing, under the gate's lock. No row
    changes (``state`` and ``kind`` are plain strings). MySQL/MariaDB get no ``ix_external``
    and lose the ``running_indexes`` (see there). The v10 tables (policy, schedules, tags,
    sweeps) are new: create_all makes them."""
    J = db.t.jobs
    ix = next(i for i in J.indexes if i.name == f"{_prefix(db)}ix_external")
    async with db.engine.begin() as conn:
        await db.ops.lock_gate(conn)

        def names(sync_conn: Any) -> set[str]:  # its columns and indexes
            from sqlalchemy import inspect

            look = inspect(sync_conn)
            return {c["name"] for c in look.get_columns(J.name)} | {
                str(i["name"]) for i in look.get_indexes(J.name)}

        have = await conn.run_sync(names)
        for name in ("releases", "snoozes"):
            if name not in have:
                await conn.execute(text(
                    f"ALTER TABLE {J.name} ADD COLUMN {name} INTEGER NOT NULL DEFAULT 0"))
        if db.ops.partial_indexes():
            await conn.run_sync(lambda sync_conn: ix.create(sync_conn, checkfirst=True))
        else:  # MySQL/MariaDB: see schema.running_indexes
            for old in sorted({str(i.name) for i in running_indexes(_prefix(db))} & have):
                await conn.execute(text(f"DROP INDEX {old} ON {J.name}"))


async def _v9_to_v10_ops_schedules(db: Database) -> None:
    """v10: the ``schedules`` table (side_tables.schedule_table). Each schedule's high-water mark
    moves from its ``cron:<name>`` meta row to its row there, so no slot is enqueued again
    after the upgrade; the spec columns stay empty until a worker declares the schedule.
    Idempotent: the table is created only if missing, a row only where none exists."""
    M, T = db.t.meta, db.t.schedules
    async with db.engine.begin() as conn:
        await db.ops.lock_gate(conn)
        await conn.run_sync(T.create, checkfirst=True)
        marks = (await conn.execute(
            select(M.c.name, M.c.value).where(M.c.name.like("cron:%")))).all()
        rows = [{"name": n[5:], "last_slot": v} for n, v in marks if 0 < len(n) - 5 <= 50]
        if rows:
            await db.ops.insert_ignore(conn, T, rows)

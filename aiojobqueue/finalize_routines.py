"""PostgreSQL's one-call finalize routines, from the aiojobqueue side: their text built
from the very statements the general path runs (``routine_spec``), and their installation
at start or by ``aiojobqueue migrate`` (``install_routines``), which hands back how to call
them (``Routines``). The DDL itself is the dialect's (dialects/postgresql/routines.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from . import fanout
from .database import Database
from .finalize import plain_stmt
from .lease_stmts import lease_values, pick_and_lease_stmt
from .release import drop_deps_stmt, drop_kids_stmt, drop_one_stmt

#: the logger of migrate.py, where this lived: what a deployment filters on stays the same
log = logging.getLogger("aiojobqueue.migrate")


@dataclass(frozen=True)
class Routines:
    """The calls of the dialect's one-call finalize routines (see finalize.py, fanout.py)."""

    finish: Any
    release: Any
    rest: Any


def routine_spec(db: Database) -> tuple[str, list[str]] | None:
    """(name, DDL) of the dialect's one-call finalize routines, built from the very
    statements the general path runs; None where the dialect has none."""
    return db.ops.settle_routine(
        lambda ids, a, o, r: plain_stmt(db, False, ids, a, o, r),
        lambda ids: drop_deps_stmt(db, ids, wake=False),
        lambda ids: drop_kids_stmt(db, ids, wake=False),
        lambda g, n, of_types, owner, ttl: pick_and_lease_stmt(
            db, g, n, of_types, lease_values(db.t, ttl, owner)),
        lambda ids: drop_one_stmt(db, ids), fanout.SPLIT, fanout.PART,
    )


async def install_routines(db: Database, create: bool) -> Routines | None:
    """The calls of the dialect's one-call finalize routines (see
    finalize.Finalizer.finish_in_one_call), creating them if they are missing and
    ``create``; None where the dialect has none, or they are missing and may not be created
    (the long path and its plain statements are used then: the same effect, more round
    trips). Their names carry a digest of their text, so an aiojobqueue whose statements
    changed installs (and uses) its own."""
    spec = routine_spec(db)
    if spec is None:
        return None
    name, ddl = spec
    async with db.engine.connect() as conn:
        there = await db.ops.routine_exists(conn, name)
    if not there and not create:
        log.info("the routine %s is missing (run `aiojobqueue migrate`): finalizing jobs "
                 "that others depend on takes more round trips", name)
        return None
    if not there:
        async with db.engine.begin() as conn:
            await db.ops.lock_gate(conn)  # one process creates them; the others then see them
            if not await db.ops.routine_exists(conn, name):
                for statement in ddl:
                    await conn.exec_driver_sql(statement)
    return Routines(*db.ops.settle_calls(name))

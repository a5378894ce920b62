"""Upgrading a version-1 schema in place (``migrate``), on every database."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import select, text, update

from aiojobqueue import JobQueue
from aiojobqueue.schema import SCHEMA_VERSION


async def test_v1_schema_upgrades_in_place(make_queue: Callable[..., JobQueue]) -> None:
    """A v1 database (no has_dependents flag, full indexes) is brought to the current version
    with its jobs intact: the flag is filled from the existing edges, and the DAG then runs."""
    q = make_queue()
    async with q:
        a = await q.enqueue("t", {})
        b = await q.enqueue("t", {}, depends_on=[a])
        J, M = q._t.jobs, q._t.meta
        async with q.engine.begin() as conn:  # back to what v1 looked like
            if conn.dialect.name == "postgresql":
                await conn.execute(text(f"DROP INDEX {q.prefix}ix_parent"))
                await conn.execute(text(
                    f"CREATE INDEX {q.prefix}ix_parent ON {J.name} (parent_id, state)"))
            await conn.execute(text(f"ALTER TABLE {J.name} DROP COLUMN has_dependents"))
            await conn.execute(update(M).where(M.c.name == "schema_version").values(value="1"))

    q2 = make_queue()
    seen: list[int] = []

    @q2.handler("t")
    async def t(ctx: object) -> None:
        seen.append(ctx.job_id)  # type: ignore[attr-defined]

    async with q2:  # upgrades
        async with q2.engine.connect() as conn:
            v = (await conn.execute(select(M.c.value).where(M.c.name == "schema_version"))
                 ).scalar_one()
            flags = dict((await conn.execute(select(J.c.id, J.c.has_dependents))).all())
            if conn.dialect.name == "postgresql":
                ddl = (await conn.execute(text(
                    "SELECT indexdef FROM pg_indexes WHERE indexname = :n"),
                    {"n": f"{q.prefix}ix_parent"})).scalar_one()
                assert "WHERE (parent_id IS NOT NULL)" in ddl, ddl
        assert v == str(SCHEMA_VERSION)
        assert flags == {a: True, b: False}
        await q2.run_until_idle()
        assert seen == [a, b]
        assert (await q2.get(b)).state == "done"

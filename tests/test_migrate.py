"""Upgrading older schemas in place (``migrate``), on every database."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import select, text, update

from aiojobqueue import JobQueue
from aiojobqueue.schema import CREDIT, SCHEMA_VERSION


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


async def test_v2_container_credit_upgrades_in_place(make_queue: Callable[..., JobQueue]) -> None:
    """v2 counted a waiting container as 1 in its children's ``pending``; v3 counts CREDIT.
    A v2 database with a container still waiting is upgraded once (a second upgrade changes
    nothing), and the container's children then run in order, after its dependency."""
    q = make_queue()
    async with q:
        async with q.batch() as b:
            a = b.add("t", {})
            box = b.container("box", depends_on=[a])
            x = b.add("t", {}, parent=box)
            y = b.add("t", {}, parent=box, depends_on=[x])
        J, M = q._t.jobs, q._t.meta
        async with q.engine.begin() as conn:  # what v2 wrote for these jobs
            await conn.execute(update(J).where(J.c.id == x.id).values(pending=1))
            await conn.execute(update(J).where(J.c.id == y.id).values(pending=2))
            await conn.execute(update(M).where(M.c.name == "schema_version").values(value="2"))

    for _ in range(2):  # the second start finds v3 and changes nothing
        q2 = make_queue()
        async with q2:
            async with q2.engine.connect() as conn:
                pending = dict((await conn.execute(
                    select(J.c.id, J.c.pending).where(J.c.id.in_([x.id, y.id])))).all())
            assert pending == {x.id: CREDIT, y.id: CREDIT + 1}

    q3 = make_queue()
    seen: list[int] = []

    @q3.handler("t")
    async def t(ctx: object) -> None:
        seen.append(ctx.job_id)  # type: ignore[attr-defined]

    async with q3:
        await q3.run_until_idle()
        assert seen == [a.id, x.id, y.id]
        assert (await q3.get(box.id)).state == "done"


async def test_children_waiting_on_a_credited_sibling_hold_no_credit(
    make_queue: Callable[..., JobQueue],
) -> None:
    """Activating a container rewrites only the children that hold its credit: those that
    wait on no credited sibling (head, tail-on-outside); a fan-out on the head does not."""
    q = make_queue()
    async with q:
        async with q.batch() as b:
            gate = b.add("t", {})
            box = b.container("box", depends_on=[gate])
            head = b.add("t", {}, parent=box)
            fan = [b.add("t", {}, parent=box, depends_on=[head]) for _ in range(3)]
            tail = b.add("t", {}, parent=box, depends_on=fan)
            solo = b.add("t", {}, parent=box, depends_on=[gate])
        J = q._t.jobs
        async with q.engine.connect() as conn:
            pending = dict((await conn.execute(select(J.c.id, J.c.pending))).all())
        assert pending[head.id] == CREDIT
        assert [pending[f.id] for f in fan] == [1, 1, 1]
        assert pending[tail.id] == 3 + CREDIT  # its siblings hold no credit themselves
        assert pending[solo.id] == 1 + CREDIT  # waits on an outside job, not on a sibling
        order: list[int] = []

        @q.handler("t")
        async def t(ctx: object) -> None:
            order.append(ctx.job_id)  # type: ignore[attr-defined]

        await q.run_until_idle()
        assert order.index(gate.id) == 0
        assert order.index(head.id) < min(order.index(f.id) for f in fan)
        assert max(order.index(f.id) for f in fan) < order.index(tail.id)
        assert (await q.get(box.id)).state == "done"

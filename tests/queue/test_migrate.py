"""Upgrading older schemas in place (``migrate``), on every database."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Index, Table, UniqueConstraint, func, insert, inspect, select, text, update
from sqlalchemy.exc import IntegrityError

from aiojobqueue import JobContext, JobQueue, fanout
from aiojobqueue.fanout import SplitReleases
from aiojobqueue.schema import CREDIT, OVERVIEW_COUNTED, SCHEMA_VERSION, build_tables


def recorder(q: JobQueue) -> list[int]:
    """The ids of the jobs of type ``t`` that ``q`` runs (its handler for ``t``)."""
    ran: list[int] = []

    @q.handler("t")
    async def t(ctx: JobContext) -> None:
        ran.append(ctx.job_id)

    return ran


async def version_of(conn: Any, meta: Table) -> str:
    """The schema version the meta table records."""
    return str((await conn.execute(
        select(meta.c.value).where(meta.c.name == "schema_version"))).scalar_one())


async def index_columns(conn: Any, table: str) -> dict[str, list[str]]:
    """The indexes of ``table``: name -> its columns."""
    return dict(await conn.run_sync(lambda c: {
        i["name"]: i["column_names"] for i in inspect(c).get_indexes(table)}))


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
            v = await version_of(conn, M)
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


def v3_jobs(prefix: str) -> Table:
    """The jobs table as v1-v3 created it: ``live_key`` unique through a constraint on the
    column (the DDL of ``Column(unique=True)``), no ``ux_live_key`` index."""
    J = build_tables(prefix).jobs
    J.indexes.remove(next(ix for ix in J.indexes if ix.name == f"{prefix}ux_live_key"))
    J.append_constraint(UniqueConstraint(J.c.live_key))
    # and ix_ready_weight over every ready job, whatever its weight
    J.indexes.remove(next(ix for ix in J.indexes if ix.name == f"{prefix}ix_ready_weight"))
    ready = text("state = 'ready'")
    Index(f"{prefix}ix_ready_weight", J.c.state, J.c.group_key, J.c.weight,
          postgresql_where=ready, sqlite_where=ready)
    return J


async def test_v3_live_key_constraint_upgrades_to_the_index(
    make_queue: Callable[..., JobQueue],
) -> None:
    """A v3 database (a UNIQUE constraint on live_key) started by several processes at once
    is brought to v4: on PostgreSQL the constraint is gone and the index is partial, on
    MariaDB the old key is replaced by ``ux_live_key``, SQLite keeps its old constraint (see
    migrate._v3_to_v4). Keys dedupe as before: the database refuses a second live job with a
    key, enqueue returns the live one, and a finished job's key can be used again."""
    q = make_queue()
    async with q:
        keyed = await q.enqueue("t", {}, key="k")
        plain = [await q.enqueue("t", {}) for _ in range(3)]
        J, M = q._t.jobs, q._t.meta
        old = v3_jobs(q.prefix)
        async with q.engine.begin() as conn:  # the same rows in the table v3 created
            rows = [r._asdict() for r in await conn.execute(select(J))]
            await conn.run_sync(J.drop)
            await conn.run_sync(old.create)
            await conn.execute(insert(old), rows)
            if conn.dialect.name == "postgresql":  # the new sequence goes on after the ids
                await conn.execute(text(f"SELECT setval(pg_get_serial_sequence('{J.name}', "
                                        f"'id'), (SELECT max(id) FROM {J.name}))"))
            await conn.execute(update(M).where(M.c.name == "schema_version").values(value="3"))

    queues = [make_queue() for _ in range(3)]
    await asyncio.gather(*(x.start() for x in queues))  # each upgrades, or finds it done
    q2 = queues[0]
    ux = f"{q2.prefix}ux_live_key"
    async with q2.engine.connect() as conn:
        v = await version_of(conn, M)
        assert v == str(SCHEMA_VERSION)
        dialect = conn.dialect.name
        if dialect == "postgresql":
            ddl = (await conn.execute(text(
                "SELECT indexdef FROM pg_indexes WHERE indexname = :n"), {"n": ux})).scalar_one()
            assert "UNIQUE" in ddl and "WHERE (live_key IS NOT NULL)" in ddl, ddl
            unique = (await conn.execute(text(
                "SELECT count(*) FROM pg_constraint WHERE conrelid = to_regclass(:t) "
                "AND contype = 'u'"), {"t": J.name})).scalar_one()
            assert unique == 0
            ddl = (await conn.execute(text("SELECT indexdef FROM pg_indexes WHERE indexname = "
                                           f"'{q2.prefix}ix_ready_weight'"))).scalar_one()
            assert "weight > 1" in ddl, ddl
        elif dialect == "mysql":
            keys = (await conn.execute(text(
                "SELECT INDEX_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = "
                "DATABASE() AND TABLE_NAME = :t AND NON_UNIQUE = 0 AND COLUMN_NAME = "
                "'live_key'"), {"t": J.name})).scalars().all()
            assert keys == [ux]
        else:
            names = [r[1] for r in await conn.exec_driver_sql(f"PRAGMA index_list({J.name})")
                     if r[2] and r[3] == "u"]  # unique, from a UNIQUE constraint
            assert len(names) == 1 and ux not in names
            cols = [r[2] for r in await conn.exec_driver_sql(f"PRAGMA index_info({names[0]})")]
            assert cols == ["live_key"]
            ddl = (await conn.exec_driver_sql(
                "SELECT sql FROM sqlite_master WHERE name = ?",
                (f"{q2.prefix}ix_ready_weight",))).scalar_one()
            assert "weight > 1" in ddl, ddl
    async with q2.engine.connect() as conn:
        with pytest.raises(IntegrityError):  # the database itself refuses a second live "k"
            await conn.execute(update(J).where(J.c.id == plain[0]).values(live_key="k"))

    seen: list[int] = []

    @q2.handler("t")
    async def t(ctx: object) -> None:
        seen.append(ctx.job_id)  # type: ignore[attr-defined]

    assert await q2.enqueue("t", {}, key="k") == keyed
    await q2.run_until_idle()
    assert sorted(seen) == sorted([keyed, *plain])
    again = await q2.enqueue("t", {}, key="k")
    assert again not in (keyed, *plain)
    assert await queues[1].enqueue("t", {}, key="k") == again


async def test_v4_schema_gains_the_releases_table(
    make_queue: Callable[..., JobQueue], monkeypatch: pytest.MonkeyPatch
) -> None:
    """v5 adds the releases table (the recorded rest of split releases): a v4 database gets
    it from the upgrade, keeps its jobs, and a DAG then runs through it (on PostgreSQL with
    its fan-out split, so the new table is written and emptied)."""
    q = make_queue()
    async with q:
        R, M = q._t.releases, q._t.meta
        async with q.batch() as b:
            head = b.add("t", {})
            outs = [b.add("t", {}, depends_on=[head]) for _ in range(12)]
        async with q.engine.begin() as conn:
            await conn.run_sync(R.drop)
            await conn.execute(update(M).where(M.c.name == "schema_version").values(value="4"))

    q2 = make_queue(capacity=1)  # the head's call leases at most 1: 4 released, 8 recorded
    monkeypatch.setattr(fanout, "SPLIT", 2)
    ran = recorder(q2)
    parts: list[int] = []
    real = SplitReleases.rest_releases

    async def spy(self: SplitReleases, n: int = 64) -> int:
        parts.append(await real(self, n))
        return parts[-1]

    monkeypatch.setattr(SplitReleases, "rest_releases", spy)

    async with q2:
        async with q2.engine.connect() as conn:
            v = await version_of(conn, M)
            assert v == str(SCHEMA_VERSION)
            assert await conn.scalar(select(func.count()).select_from(R)) == 0
        await q2.run_until_idle()
        assert ran[0] == head.id and sorted(ran[1:]) == sorted(o.id for o in outs)
        async with q2.engine.connect() as conn:
            assert await conn.scalar(select(func.count()).select_from(R)) == 0
            assert (sum(parts) >= 1) == (conn.dialect.name == "postgresql"), parts


async def test_v5_schema_gains_the_observability_columns(
    make_queue: Callable[..., JobQueue],
) -> None:
    """v6 adds ``progress`` and ``errors`` to jobs, ``types``, ``capacity`` and ``config`` to
    workers: a v5 database gets them from the upgrade with its jobs intact, and they fill."""
    q = make_queue()
    async with q:
        J, W, M = q._t.jobs, q._t.workers, q._t.meta
        jid = await q.enqueue("t", {})
        async with q.engine.begin() as conn:  # back to what v5 looked like
            for table, names in ((J, ("progress", "errors")),
                                 (W, ("types", "capacity", "config"))):
                for name in names:
                    await conn.execute(text(f"ALTER TABLE {table.name} DROP COLUMN {name}"))
            await conn.execute(update(M).where(M.c.name == "schema_version").values(value="5"))

    q2 = make_queue(retry_backoff=0.001, retry_backoff_max=0.002)

    @q2.handler("t", max_attempts=2)
    async def t(ctx: JobContext) -> None:
        await ctx.progress(ctx.attempt, total=2)
        if ctx.attempt == 1:
            raise ValueError("once")

    async with q2:  # upgrades
        async with q2.engine.connect() as conn:
            v = await version_of(conn, M)
        assert v == str(SCHEMA_VERSION)
        await q2.run_until_idle()
        job = await q2.get(jid)
        assert job.state == "done"
        assert [(e["attempt"], e["type"]) for e in job.errors] == [(1, "ValueError")]
        assert job.progress is not None and (job.progress["done"], job.progress["total"]) == (2, 2)

        def columns(sync_conn: Any) -> dict[str, set[str]]:
            from sqlalchemy import inspect

            return {t.name: {c["name"] for c in inspect(sync_conn).get_columns(t.name)}
                    for t in (J, W)}

        async with q2.engine.connect() as conn:
            have = await conn.run_sync(columns)
        assert {"progress", "errors"} <= have[J.name]
        assert {"types", "capacity", "config"} <= have[W.name]


async def test_v6_schema_gains_the_trace_column_and_the_overview_indexes(
    make_queue: Callable[..., JobQueue],
) -> None:
    """v7 adds the nullable ``trace`` column to jobs and, on PostgreSQL and SQLite, the
    partial indexes by (state, group_key) for waiting, scheduled and failed jobs
    (schema.overview_indexes): a v6 database gets them from the upgrade with its jobs
    intact (they stay NULL and run), and a traced enqueue then fills the column.
    MySQL/MariaDB get no such index (their indexes cover every row)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.util._once import Once

    q = make_queue()
    names = {f"{q.prefix}ix_{s}_group" for s in OVERVIEW_COUNTED}

    def indexes(sync_conn: Any) -> set[str]:
        return {ix["name"] for ix in inspect(sync_conn).get_indexes(f"{q.prefix}jobs")}

    async with q:
        J, M = q._t.jobs, q._t.meta
        old = await q.enqueue("t", {})
        async with q.engine.begin() as conn:  # back to what v6 looked like
            partial = conn.dialect.name in ("postgresql", "sqlite")
            have = await conn.run_sync(indexes)
            assert (have & names) == (names if partial else set())
            for name in have & names:
                await conn.execute(text(f"DROP INDEX {name}"))
            await conn.execute(text(f"ALTER TABLE {J.name} DROP COLUMN trace"))
            await conn.execute(update(M).where(M.c.name == "schema_version").values(value="6"))
            assert not await conn.run_sync(indexes) & names

    q2 = make_queue()
    ran = recorder(q2)

    def provider(p: TracerProvider | None) -> None:
        trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
        trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
        if p is not None:
            trace.set_tracer_provider(p)

    async with q2:  # upgrades
        async with q2.engine.connect() as conn:
            v = await version_of(conn, M)
            assert v == str(SCHEMA_VERSION) == "10"
            have = await conn.run_sync(indexes)
        assert (have & names) == (names if partial else set())
        provider(TracerProvider())
        try:
            new = await q2.enqueue("t", {})
        finally:
            provider(None)
        await q2.run_until_idle()
        async with q2.engine.connect() as conn:
            stored = dict((await conn.execute(select(J.c.id, J.c.trace))).all())
    assert sorted(ran) == [old, new]
    assert stored[old] is None and stored[new]["traceparent"].startswith("00-")


async def test_v7_rate_ledger_gains_starts_and_its_rows_count_one_each(
    make_queue: Callable[..., JobQueue],
) -> None:
    """v8 adds ``starts`` to the rate ledger (one row per claim) and to ``ix_rate``: the
    rows a v7 worker wrote (one per start, no such column) count one each after the
    upgrade, so the window they are in stays as full as it was; new claims then add one
    row for all they leased."""
    from aiojobqueue import RateLimit
    from aiojobqueue.timeutil import db_now

    q = make_queue()
    async with q:
        R, M = q._t.rate, q._t.meta
        ix = f"{q.prefix}ix_rate"
        async with q.engine.begin() as conn:  # back to what v7 looked like, 3 starts in it
            on = f" ON {R.name}" if conn.dialect.name in ("mysql", "mariadb") else ""
            await conn.execute(text(f"DROP INDEX {ix}{on}"))
            await conn.execute(text(f"ALTER TABLE {R.name} DROP COLUMN starts"))
            await conn.execute(text(f"CREATE INDEX {ix} ON {R.name} (name, at)"))
            for _ in range(3):
                await conn.execute(insert(R).values(name="r", at=db_now()))
            await conn.execute(update(M).where(M.c.name == "schema_version").values(value="7"))

    lim = RateLimit(6, per=60.0, name="r")
    q2 = make_queue(limits=[lim], capacity=10)
    ran = recorder(q2)

    async with q2:  # upgrades
        async with q2.engine.connect() as conn:
            v = await version_of(conn, M)
            assert v == str(SCHEMA_VERSION) == "10"
            assert sorted(r[0] for r in await conn.execute(select(R.c.starts))) == [1, 1, 1]
            found = await index_columns(conn, R.name)
            assert found[ix] == ["name", "at", "starts"]  # the budget's SUM reads it alone
            assert await lim.budget(conn, q2._t) == 3
        async with q2.batch() as b:
            refs = [b.add("t", {}) for _ in range(3)]
        await q2.run_until_idle()
        async with q2.engine.connect() as conn:
            rows = sorted(r[0] for r in await conn.execute(select(R.c.starts)))
            assert await lim.budget(conn, q2._t) == 0
    assert sorted(ran) == sorted(r.id for r in refs)
    assert sum(rows) == 6 and len(rows) < 6  # the new claims took one row each, not one a start


async def test_v8_schema_gains_the_leased_index(make_queue: Callable[..., JobQueue]) -> None:
    """v9 adds the ``leased`` state (jobs a capped worker holds ahead) and its index
    ``ix_leased``: a v8 schema (no such index) gains it on upgrade, and a v9 worker then
    serves it under a cap (holding jobs ahead)."""
    q = make_queue()
    async with q:
        J, M = q._t.jobs, q._t.meta
        ix = f"{q.prefix}ix_leased"
        async with q.engine.begin() as conn:  # back to what v8 looked like
            on = f" ON {J.name}" if conn.dialect.name in ("mysql", "mariadb") else ""
            await conn.execute(text(f"DROP INDEX {ix}{on}"))
            await conn.execute(update(M).where(M.c.name == "schema_version").values(value="8"))

    q2 = make_queue(concurrency=2, capacity=2)
    ran = recorder(q2)

    async with q2:  # upgrades
        async with q2.engine.connect() as conn:
            v = await version_of(conn, M)
            assert v == str(SCHEMA_VERSION) == "10"
            found = await index_columns(conn, J.name)
            assert found[ix] == ["state", "lease_owner", "lease_expires"]
        async with q2.batch() as b:
            refs = [b.add("t", {}) for _ in range(20)]
        await q2.run_until_idle()
    assert sorted(ran) == sorted(r.id for r in refs)


async def test_v9_schema_gains_snoozes_and_the_external_index(
    make_queue: Callable[..., JobQueue],
) -> None:
    """v10 (workflows) adds ``snoozes`` and ``ix_external``: a v9 schema with a job in it
    gains both on upgrade (the job keeps its row, counted 0 snoozes), and external steps
    and snoozes then work. On MySQL/MariaDB the upgrade builds no ``ix_external`` and drops
    v9's two indexes of the running rows (schema.running_indexes)."""
    from aiojobqueue import Snooze

    q = make_queue()
    running = {f"{q.prefix}ix_running": "state, group_key, lease_expires",
               f"{q.prefix}ix_running_owner": "state, lease_owner"}
    async with q:
        J, M = q._t.jobs, q._t.meta
        ix = f"{q.prefix}ix_external"
        old = await q.enqueue("t", {"v": 1})
        async with q.engine.begin() as conn:  # back to what v9 looked like
            mysql = conn.dialect.name in ("mysql", "mariadb")
            if mysql:
                assert not set(await index_columns(conn, J.name)) & {ix, *running}
                for name, cols in running.items():
                    await conn.execute(text(f"CREATE INDEX {name} ON {J.name} ({cols})"))
            else:
                await conn.execute(text(f"DROP INDEX {ix}"))
            await conn.execute(text(f"ALTER TABLE {J.name} DROP COLUMN snoozes"))
            await conn.execute(update(M).where(M.c.name == "schema_version").values(value="9"))

    q2 = make_queue()
    naps: list[int] = []

    @q2.handler("t")
    async def t(ctx: JobContext, v: int) -> None:
        naps.append(v)
        if len(naps) == 1:
            raise Snooze(0)

    async with q2:  # upgrades
        async with q2.engine.connect() as conn:
            assert await version_of(conn, M) == str(SCHEMA_VERSION) == "10"
            found = await index_columns(conn, J.name)
            if mysql:
                assert not set(found) & {ix, *running}
            else:
                assert found[ix] == ["state", "lease_expires"]
                assert found[f"{q.prefix}ix_running_owner"] == ["state", "lease_owner"]
        assert (await q2.get(old)).snoozes == 0
        step = await q2.enqueue_external(timeout=60)
        await q2.run_until_idle()
        job = await q2.get(old)
        assert job.state == "done" and job.snoozes == 1 and naps == [1, 1]
        await q2.complete(step, 1)
        assert (await q2.get(step)).result == 1

"""The DAG fast paths keep the guarantees: the one-statement release of dependents and the
portable path agree (pending taken off once per edge, released exactly when it reaches
zero), a roll-up is skipped only while this transaction holds a live child, concurrent last
children still finish their container exactly once, and the dependents' UPDATE stays on
the primary key under PostgreSQL's generic plan when the edges are skewed."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import any_, event, insert, literal_column, select, text

import aiojobqueue.census as census_mod
import aiojobqueue.claim as claim_mod
from aiojobqueue import JobQueue, JobState
from aiojobqueue.claimed import Claimed
from aiojobqueue.finalize import Outcome
from aiojobqueue.finalize_routines import routine_spec
from aiojobqueue.lease import PickThenLease
from aiojobqueue.release import LockedWrites, drop_deps_stmt, drop_one_stmt
from aiojobqueue.settle import Settler

#: an actual row count in EXPLAIN ANALYZE: "rows=3000 " up to PostgreSQL 17, "rows=3000.00 "
#: from 18 (actual counts became averages with two decimals)
ACTUAL_ROWS = r"rows={}(\.0+)? "


async def claim_now(q: JobQueue, want: int = 100) -> list[Claimed]:
    return await q._write(lambda conn: q._core.claimer.claim(conn, want, ["t"]))


async def finish(q: JobQueue, ids: list[int]) -> list[Outcome]:
    outs = [Outcome(i, 1, q.worker_id, "done") for i in ids]
    return await q._write(lambda conn: q._core.finalizer.finish(conn, outs))


async def pending(q: JobQueue, *ids: int) -> dict[int, tuple[str, int]]:
    J = q._t.jobs

    async def read(conn: Any) -> dict[int, tuple[str, int]]:
        rows = await conn.execute(select(J.c.id, J.c.state, J.c.pending).where(J.c.id.in_(ids)))
        return {r.id: (r.state, r.pending) for r in rows}

    return await q._read(read)


#: Both settle paths on every database that has them (MySQL/MariaDB: the portable one only).
PATHS = pytest.mark.parametrize(("db", "path"), [
    ("sqlite", "one-statement"), ("sqlite", "portable"), ("postgresql", "one-statement"),
    ("postgresql", "portable"), ("mariadb", "portable"),
], indirect=["db"])


def use_path(q: JobQueue, path: str) -> None:
    """Force the portable path (what MySQL/MariaDB run) on any database."""
    assert q._core is not None
    if path == "portable":
        q._core.settler.path = LockedWrites(q._core.db)
        q._core.claimer.path = PickThenLease(q._core.db, q.settings)
    assert isinstance(q._core.settler.path, LockedWrites) == (path == "portable")


@PATHS
async def test_edges_counted_once_and_released_at_zero(
    make_queue: Callable[..., JobQueue], path: str
) -> None:
    q = make_queue()
    async with q:
        use_path(q, path)
        async with q.batch() as b:
            a, b2, c = b.add("t"), b.add("t"), b.add("t")
            two = b.add("t", depends_on=[a, b2])  # both upstreams finish in one round
            three = b.add("t", depends_on=[a, b2, c])
            later = b.add("t", depends_on=[a], run_after=timedelta(hours=1))
            box = b.container("box", depends_on=[a, b2])
            inner = b.add("t", parent=box)
            held = b.add("t", parent=box, depends_on=[c])
            empty = b.container("empty", depends_on=[a])
            after_empty = b.add("t", depends_on=[empty])
        assert {x.id for x in await claim_now(q)} == {a.id, b2.id, c.id}
        assert len(await finish(q, [a.id, b2.id])) == 2
        got = await pending(q, two.id, three.id, later.id, box.id, inner.id, held.id,
                            empty.id, after_empty.id)
        assert got == {
            two.id: ("ready", 0), three.id: ("waiting", 1), later.id: ("scheduled", 0),
            box.id: ("active", 0), inner.id: ("ready", 0), held.id: ("waiting", 1),
            empty.id: ("done", 0),  # no children: finished at once, and released what waits
            after_empty.id: ("ready", 0),
        }
        assert (await q.get(box.id)).state == JobState.ACTIVE
        await finish(q, [c.id])
        got = await pending(q, three.id, held.id)
        assert got == {three.id: ("ready", 0), held.id: ("ready", 0)}


@PATHS
async def test_rollup_skipped_only_while_a_live_child_is_held(
    make_queue: Callable[..., JobQueue], path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = make_queue()
    rolled: list[list[int]] = []
    real = Settler._rollup

    async def spy(self: Settler, conn: Any, containers: Any) -> Any:
        rolled.append(sorted(containers))
        return await real(self, conn, containers)

    monkeypatch.setattr(Settler, "_rollup", spy)
    async with q:
        use_path(q, path)
        async with q.batch() as b:
            box = b.container("box")
            head = b.add("t", parent=box)
            fan = [b.add("t", parent=box, depends_on=[head]) for _ in range(4)]
            tail = b.add("t", parent=box, depends_on=fan)
        assert [x.id for x in await claim_now(q)] == [head.id]
        rolled.clear()
        await finish(q, [head.id])  # released the fan-out: live children we hold
        assert all(box.id not in r for r in rolled), rolled
        assert {x.id for x in await claim_now(q)} == {f.id for f in fan}
        await finish(q, [fan[0].id, fan[1].id])  # the tail waits on: still held by us
        assert all(box.id not in r for r in rolled), rolled
        await finish(q, [fan[2].id, fan[3].id])  # the tail is released: held again
        assert all(box.id not in r for r in rolled), rolled
        assert (await q.get(box.id)).state == JobState.ACTIVE
        assert [x.id for x in await claim_now(q)] == [tail.id]
        await finish(q, [tail.id])  # no dependents: the roll-up runs and finishes the box
        assert [box.id] in rolled
        assert (await q.get(box.id)).state == JobState.DONE


async def test_last_children_finishing_at_once_finish_the_container(
    make_queue: Callable[..., JobQueue], db: str
) -> None:
    """Children finished in concurrent transactions (one each, all at once), round after
    round: every container ends done, once, whichever transaction came last."""
    q = make_queue()
    async with q:
        boxes = []
        async with q.batch() as b:
            for _ in range(6):
                box = b.container("box")
                for _ in range(4):
                    b.add("t", parent=box)
                boxes.append(box)
        got = await claim_now(q)
        assert len(got) == 24
        applied = await asyncio.gather(*(finish(q, [c.id]) for c in got))
        assert all(len(a) == 1 for a in applied)
        for box in boxes:
            job = await q.get(box.id)
            assert job.state == JobState.DONE, (db, job)


def release_sql(q: JobQueue, ids: str) -> str:
    """The release statement as the PostgreSQL release routine runs it, ``ids`` its array."""
    stmt = drop_deps_stmt(q._core.db, lambda col: col == any_(literal_column(ids)), wake=False)
    return str(stmt.compile(dialect=q.engine.dialect, compile_kwargs={"literal_binds": True}))


async def skewed_edges(q: JobQueue) -> int:
    """20,000 done jobs and 5,000 waiting on one upstream (returned), analysed."""
    J, D = q._t.jobs, q._t.deps
    now = datetime.now(UTC)
    base = {"type": "t", "kind": "job", "args": {}, "group_key": "default", "run_after": now,
            "max_attempts": 1, "attempt_limit": 1, "created_at": now, "attempts": 0,
            "weight": 1, "priority": 0, "pending": 0}
    async with q.engine.begin() as conn:
        await conn.execute(insert(J), [dict(base, state="done") for _ in range(20_000)])
        blocker = (await conn.execute(
            insert(J).values(dict(base, state="waiting", pending=1)).returning(J.c.id)
        )).scalar_one()
        waiting = (await conn.execute(
            insert(J).returning(J.c.id),
            [dict(base, state="waiting", pending=1) for _ in range(5_000)],
        )).scalars().all()
        await conn.execute(insert(D), [{"job_id": w, "depends_on_id": blocker}
                                       for w in waiting])
    async with q.engine.connect() as conn:
        await conn.execute(text(f"ANALYZE {J.name}"))
        await conn.execute(text(f"ANALYZE {D.name}"))
        await conn.commit()
    return int(blocker)


@pytest.mark.parametrize("db", ["postgresql"], indirect=True)  # generic plans are PG's
async def test_dependents_update_stays_on_the_primary_key(
    make_queue: Callable[..., JobQueue], db: str
) -> None:
    """Skewed edges (thousands of jobs waiting on one upstream) must not turn the dependents'
    UPDATE into a hash join over a sequential scan of the jobs table under a generic plan."""
    q = make_queue()
    async with q:
        J = q._t.jobs
        async with q.batch() as b:
            up = b.add("t")
            down = b.add("t", depends_on=[up])
        blocker = await skewed_edges(q)
        await claim_now(q)
        await finish(q, [up.id])
        assert (await q.get(down.id)).state == JobState.READY
        # the statement the release routine runs, with the routine's settings
        stmt = release_sql(q, "$1::bigint[]")
        args = f"'{{{blocker},{up.id}}}'"
        async with q.engine.connect() as conn:
            await conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
            await conn.exec_driver_sql("SET enable_nestloop = off")
            await conn.exec_driver_sql(f"PREPARE ajq_drop AS {stmt}")
            plan = [r[0] for r in await conn.exec_driver_sql(f"EXPLAIN EXECUTE ajq_drop({args})")]
            await conn.exec_driver_sql("DEALLOCATE ajq_drop")
            await conn.rollback()
        # (the edge look-up itself may scan the deps table under a *forced* generic plan with
        # this skew, exactly like the plain SELECT it replaced; the automatic mode keeps the
        # custom plan there, which is far cheaper)
        assert not any(f"Seq Scan on {J.name}" in x for x in plan), plan
        assert any(f"{J.name}_pkey" in x for x in plan), plan


async def wide_fan_out(q: JobQueue, n: int) -> tuple[Any, str]:
    """A head job and ``n`` jobs waiting on it, just enqueued (no ANALYZE yet); returns the
    head and the name of the PostgreSQL finalize routine."""
    async with q.batch() as b:
        head = b.add("t", {})
        for _ in range(n):
            b.add("t", {}, depends_on=[head])
    spec = routine_spec(q._core.db)
    assert spec is not None
    return head, spec[0]


@pytest.mark.parametrize("db", ["postgresql"], indirect=True)
async def test_release_of_a_wide_fan_out_is_not_quadratic_on_a_fresh_table(
    make_queue: Callable[..., JobQueue],
) -> None:
    """Before the first ANALYZE the planner takes a head job's dependents for one row and
    joined them to the edge counts by a nested loop, re-scanning the counts per dependent:
    quadratic (2.8 s to release 5,000). The release routine runs with nested loops off, so
    the plan of its statement on such a table joins by hashing, with no per-row filter."""
    q = make_queue()
    async with q:
        head, routine = await wide_fan_out(q, 3000)
        assert q._core.settler.path.release_call is not None
        stmt = release_sql(q, f"'{{{head.id}}}'::bigint[]")
        async with q.engine.connect() as conn:
            config = (await conn.execute(text(
                "SELECT proconfig FROM pg_proc WHERE proname = :n"),
                {"n": routine + "_rel"})).scalar_one()
            assert "enable_nestloop=off" in config, config
            await conn.exec_driver_sql("SET enable_nestloop = off")
            plan = [r[0] for r in await conn.exec_driver_sql("EXPLAIN ANALYZE " + stmt)]
            await conn.rollback()
        assert any(re.search(ACTUAL_ROWS.format(3000), x) and "Update on" in x for x in plan), plan
        assert not any("Join Filter" in x or "Nested Loop" in x for x in plan), plan


async def test_a_short_claim_of_the_only_group_hands_over_without_a_census(
    make_queue: Callable[..., JobQueue], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A DAG step releases a few jobs of the one known group: the claim that takes them
    (fewer than it wanted, but some) returns them without first looking for other groups,
    which the claim after it does if the known group is dry by then: a group that appeared
    meanwhile is found at once. (The census and promotion windows are widened, so a slow
    machine cannot let them lapse between the claims.)"""
    monkeypatch.setattr(claim_mod, "LOOK_EVERY", 60.0)
    q = make_queue(poll_interval=60.0)
    async with q:
        G = census_mod.CENSUS_CTE
        seen: list[str] = []

        def spy(_c: Any, _cur: Any, stmt: str, *_: Any) -> None:
            seen.append(stmt)

        await q.enqueue("t", {}, group="a")
        assert len(await claim_now(q, 5)) == 1  # the first census: "a" is the only group
        await q.enqueue("t", {}, group="a")
        event.listen(q.engine.sync_engine, "before_cursor_execute", spy)
        try:
            got = await claim_now(q, 5)
            assert [c.group for c in got] == ["a"]
            assert not any(G in s for s in seen), seen  # no census before handing over
            assert q._core.claimer.census_due
            await q.enqueue("t", {}, group="b")
            seen.clear()
            got = await claim_now(q, 5)  # "a" is dry: look for others now
            assert [c.group for c in got] == ["b"]
            assert any(G in s for s in seen)
            assert not q._core.claimer.census_due
        finally:
            event.remove(q.engine.sync_engine, "before_cursor_execute", spy)


@pytest.mark.parametrize("db", ["postgresql"], indirect=True)
async def test_split_release_stays_on_the_primary_key_before_the_first_analyze(
    make_queue: Callable[..., JobQueue],
) -> None:
    """A part of a split release (a few hundred ids) on a table loaded moments ago: before
    autovacuum has analysed it, the planner took the release for one row and read the whole
    jobs table for it (5 ms for 256 ids on 20,000 jobs, against 2 ms by the primary key), in
    the head's finalize call and in every part. The routines run with sequential scans off:
    each of their statements has an index made for it."""
    q = make_queue()
    async with q:
        head, routine = await wide_fan_out(q, 20_000)
        J, D = q._t.jobs, q._t.deps
        async with q.engine.connect() as conn:
            configs = (await conn.execute(text(
                "SELECT proname, proconfig FROM pg_proc WHERE proname LIKE :n"),
                {"n": routine + "%"})).all()
            assert len(configs) == 3, configs
            for name, config in configs:
                assert "enable_seqscan=off" in config, (name, config)
                assert "enable_nestloop=off" in config, (name, config)
            part = (await conn.execute(
                select(D.c.job_id).where(D.c.depends_on_id == head.id)
                .order_by(D.c.job_id).limit(256))).scalars().all()
            ids = literal_column("'{" + ",".join(map(str, part)) + "}'::bigint[]")
            stmt = drop_one_stmt(q._core.db, lambda col: col == any_(ids))
            sql = str(stmt.compile(dialect=q.engine.dialect,
                                   compile_kwargs={"literal_binds": True}))
            for name, value in (c.split("=") for c in configs[0][1]):
                await conn.exec_driver_sql(f"SET {name} = {value}")
            plan = [r[0] for r in await conn.exec_driver_sql("EXPLAIN ANALYZE " + sql)]
            await conn.rollback()
        assert any(re.search(ACTUAL_ROWS.format(256), x) and "Update on" in x for x in plan), plan
        assert not any(f"Seq Scan on {J.name}" in x for x in plan), plan
        assert any(f"{J.name}_pkey" in x for x in plan), plan


@pytest.mark.parametrize("db", ["postgresql"], indirect=True)
async def test_routines_plan_once_per_session_and_stay_on_the_indexes_under_skew(
    make_queue: Callable[..., JobQueue],
) -> None:
    """The routines run on generic plans: each statement is planned once per session, not
    at every call (a custom plan weighs every index of the jobs table again: about 3 us of
    server CPU per job of a DAG drain, bench/pg_dag_stats.py). With the routines' own
    settings (sequential scans off) the release's generic plan stays on the edges' index
    and the primary key even with thousands of jobs waiting on one upstream."""
    q = make_queue()
    async with q:
        J, D = q._t.jobs, q._t.deps
        blocker = await skewed_edges(q)
        spec = routine_spec(q._core.db)
        assert spec is not None
        stmt = release_sql(q, "$1::bigint[]")
        async with q.engine.connect() as conn:
            configs = (await conn.execute(text(
                "SELECT proname, proconfig FROM pg_proc WHERE proname LIKE :n"),
                {"n": spec[0] + "%"})).all()
            assert len(configs) == 3, configs
            for name, config in configs:
                assert "plan_cache_mode=force_generic_plan" in config, (name, config)
            for name, value in (c.split("=") for c in configs[0][1]):
                await conn.exec_driver_sql(f"SET {name} = {value}")
            await conn.exec_driver_sql(f"PREPARE ajq_drop AS {stmt}")
            plan = [r[0] for r in await conn.exec_driver_sql(
                f"EXPLAIN EXECUTE ajq_drop('{{{blocker}}}')")]
            await conn.exec_driver_sql("DEALLOCATE ajq_drop")
            await conn.rollback()
        assert not any("Seq Scan" in x for x in plan), plan
        assert any(f"{D.name}" in x and "ix_deps_up" in x for x in plan), plan
        assert any(f"{J.name}_pkey" in x for x in plan), plan

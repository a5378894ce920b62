"""The claim conformance suite, run on every dialect: the ready index carries the scan,
concurrent claimers (tasks and processes) get disjoint jobs, claim order is priority then
id, unfinished dependencies are never claimed, expired leases are reclaimed, and a stale
finalize changes nothing."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import event, insert, select, text

from aiojobqueue import JobContext, JobQueue, JobState
from aiojobqueue.claimed import Claimed
from aiojobqueue.finalize import Outcome

WORKER = Path(__file__).resolve().parents[1] / "dagworker.py"


async def claim_now(q: JobQueue, want: int = 10, types: tuple[str, ...] = ("t",)) -> list[Claimed]:
    return await q._write(lambda conn: q._core.claimer.claim(conn, want, list(types)))


async def finish(q: JobQueue, *outcomes: Outcome) -> list[Outcome]:
    return await q._write(lambda conn: q._core.finalizer.finish(conn, list(outcomes)))


async def row(q: JobQueue, jid: int) -> Any:
    J = q._t.jobs
    return await q._read(lambda c: _first(c, select(J).where(J.c.id == jid)))


async def _first(conn: Any, stmt: Any) -> Any:
    return (await conn.execute(stmt)).first()


# -- the scan stays on the ready index -------------------------------------------------------


async def _fill(q: JobQueue, done: int, waiting: int, ready: int) -> None:
    """Bulk rows straight into the table: the claim must not walk the first two kinds."""
    J = q._t.jobs
    now = datetime.now(UTC)
    base = {"type": "t", "kind": "job", "args": {}, "group_key": "default", "run_after": now,
            "max_attempts": 1, "attempt_limit": 1, "created_at": now, "attempts": 0,
            "weight": 1, "priority": 0}
    async with q.engine.begin() as conn:
        for state, n in (("done", done), ("waiting", waiting), ("ready", ready)):
            rows = [dict(base, state=state, pending=int(state == "waiting")) for _ in range(n)]
            for i in range(0, n, 5000):
                await conn.execute(insert(J), rows[i : i + 5000])
        assert q._inserter is not None
        await q._inserter.groups.ensure(conn, ["default"])


async def _claim_selects(q: JobQueue) -> list[tuple[str, Any]]:
    """The SELECTs (and the UPDATE that picks and leases in one statement, where the dialect
    has UPDATE ... RETURNING) the claim transaction really sends (rolled back)."""
    seen: list[tuple[str, Any]] = []

    def on_execute(conn: Any, cursor: Any, statement: str, params: Any, *a: Any) -> None:
        head = statement.lstrip().upper()
        if head.startswith("SELECT") or (head.startswith("UPDATE") and "ORDER BY" in head):
            seen.append((statement, params))

    event.listen(q.engine.sync_engine, "before_cursor_execute", on_execute)
    try:
        async with q.engine.connect() as conn:
            await conn.begin()
            got = await q._core.claimer.claim(conn, 5, ["t"])
            await conn.rollback()
    finally:
        event.remove(q.engine.sync_engine, "before_cursor_execute", on_execute)
    assert len(got) == 5
    return seen


def _literal(v: Any) -> str:
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    assert isinstance(v, int | float), v
    return repr(v)


async def test_claim_uses_the_ready_index(make_queue: Callable[..., JobQueue], db: str) -> None:
    q = make_queue()
    async with q:
        J = q._t.jobs
        ix = f"{q.prefix}ix_ready"
        await _fill(q, done=15_000, waiting=15_000, ready=40)
        async with q.engine.connect() as conn:
            analyze = {"sqlite": "ANALYZE", "postgresql": f"ANALYZE {J.name}",
                       "mariadb": f"ANALYZE TABLE {J.name}"}[db]
            await conn.execute(text(analyze))
            await conn.commit()
        selects = await _claim_selects(q)
        pick = [s for s in selects if "ORDER BY" in s[0] and "priority DESC" in s[0]
                and f"{q.prefix}groups" not in s[0]]
        assert len(pick) == 1, selects
        stmt, params = pick[0]
        plans: list[str] = []
        async with q.engine.connect() as conn:
            for s, p in selects:  # no SELECT of the claim may walk the whole jobs table
                if db == "sqlite":
                    plan = [r[3] for r in await conn.exec_driver_sql("EXPLAIN QUERY PLAN " + s, p)]
                    assert not any(x == f"SCAN {J.name}" for x in plan), (s, plan)
                elif db == "postgresql":
                    plan = [r[0] for r in await conn.exec_driver_sql("EXPLAIN " + s, p)]
                    assert not any(f"Seq Scan on {J.name}" in x for x in plan), (s, plan)
                else:
                    rows = (await conn.exec_driver_sql("EXPLAIN " + s, p)).mappings().all()
                    plan = [f"{r['table']} type={r['type']} key={r['key']}" for r in rows]
                    assert not any(x.startswith(f"{J.name} type=ALL") for x in plan), (s, plan)
                if s == stmt:
                    plans = plan
            assert any(ix in x for x in plans), plans
            print(f"\n[{db}] claim SELECT plan:\n  " + "\n  ".join(plans))
            if db == "postgresql":
                # asyncpg prepares statements: after 5 runs PostgreSQL may switch to a generic
                # plan, where a bound state could not prove the partial index (dialect-facts 18)
                args = ", ".join(_literal(v) for v in params)
                await conn.exec_driver_sql(f"PREPARE ajq_claim AS {stmt}")
                for _ in range(7):
                    await conn.exec_driver_sql(f"EXECUTE ajq_claim({args})")
                generic = [r[0] for r in await conn.exec_driver_sql(
                    f"EXPLAIN EXECUTE ajq_claim({args})")]
                assert any(ix in x for x in generic), generic
                await conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
                forced = [r[0] for r in await conn.exec_driver_sql(
                    f"EXPLAIN EXECUTE ajq_claim({args})")]
                assert any(ix in x for x in forced), forced
                print("[postgresql] generic plan after 7 executions:\n  " + "\n  ".join(generic))
                await conn.exec_driver_sql("DEALLOCATE ajq_claim")
            await conn.rollback()


# -- disjoint claims ----------------------------------------------------------------------


async def test_concurrent_claimers_get_disjoint_jobs(make_queue: Callable[..., JobQueue]) -> None:
    queues = [make_queue() for _ in range(4)]
    for q in queues:
        await q.start()
    async with queues[0].batch() as b:
        refs = [b.add("t", {"i": i}, group=f"g{i % 3}") for i in range(300)]
    claims: list[tuple[int, str]] = []

    async def claimer(q: JobQueue) -> None:
        idle = 0
        while idle < 3:
            got = await claim_now(q, random.randint(1, 7))
            claims.extend((c.id, q.worker_id) for c in got)
            idle = 0 if got else idle + 1
            await asyncio.sleep(random.random() * 0.003)

    await asyncio.gather(*(claimer(q) for q in queues for _ in range(2)))
    ids = [c[0] for c in claims]
    assert sorted(ids) == sorted(r.id for r in refs), Counter(ids).most_common(3)
    owners = {c[1] for c in claims}
    assert len(owners) >= 2
    for jid, owner in claims[:: 17]:
        r = await row(queues[0], jid)
        assert (r.state, r.lease_owner, r.attempts) == ("running", owner, 1)


async def test_claim_skips_what_an_open_claim_holds(make_queue: Callable[..., JobQueue]) -> None:
    q1, q2 = make_queue(), make_queue()
    await q1.start()
    await q2.start()
    async with q1.batch() as b:
        refs = [b.add("t") for _ in range(10)]
    async with q1.engine.connect() as conn:
        await conn.begin()
        first = await q1._core.claimer.claim(conn, 4, ["t"])  # not committed yet
        second = asyncio.create_task(claim_now(q2, 4))
        # PostgreSQL/MariaDB: SKIP LOCKED answers at once; SQLite: waits for the write lock
        await asyncio.wait({second}, timeout=0.5)
        await conn.commit()
    got = await second
    a, b2 = {c.id for c in first}, {c.id for c in got}
    assert len(a) == 4 and len(b2) == 4 and not a & b2
    rest = await claim_now(q1, 10)
    assert {c.id for c in rest} | a | b2 == {r.id for r in refs}


async def test_claimer_processes_get_disjoint_jobs(
    make_queue: Callable[..., JobQueue], db_url: str, prefix: str, tmp_path: Path
) -> None:
    q = make_queue()
    async with q:
        async with q.batch() as b:
            refs = [b.add("t", {"i": i}, priority=i % 4, group=f"g{i % 2}") for i in range(400)]
        go = tmp_path / "go"
        logs = [tmp_path / f"claims-{k}.log" for k in range(3)]
        procs = [
            subprocess.Popen(  # noqa: ASYNC220 - spawning is quick; the wait is polled
                [sys.executable, str(WORKER), "claim", db_url, prefix, str(p), str(go)])
            for p in logs
        ]
        try:
            await asyncio.sleep(0.5)
            go.touch()
            deadline = time.monotonic() + 60
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
        assert [p.returncode for p in procs] == [0, 0, 0]
        claims = [line.split() for p in logs for line in p.read_text().splitlines()]
        ids = [int(c[1]) for c in claims]
        assert Counter(ids).most_common(1)[0][1] == 1, "a job was claimed twice"
        assert sorted(ids) == sorted(r.id for r in refs)
        assert len({c[3] for c in claims}) >= 2, "only one process claimed anything"
        J = q._t.jobs
        stored = {r.id: r.lease_owner for r in await q._read(
            lambda c: _all(c, select(J.c.id, J.c.lease_owner)))}
        assert all(stored[int(c[1])] == c[3] for c in claims)


async def _all(conn: Any, stmt: Any) -> list[Any]:
    return list(await conn.execute(stmt))


# -- what is claimed, in which order ----------------------------------------------------------


async def test_claim_order_is_priority_then_id(queue: JobQueue) -> None:
    prios = [0, 3, -1, 3, 7, 0, 7, 2]
    ids = [await queue.enqueue("t", {}, priority=p) for p in prios]
    expected = [i for _, i in sorted(zip(prios, ids, strict=True), key=lambda x: (-x[0], x[1]))]
    got = [(await claim_now(queue, 1))[0].id for _ in ids]
    assert got == expected
    assert await claim_now(queue, 1) == []
    # a multi-job claim takes the best n
    more = [await queue.enqueue("t", {}, priority=p) for p in prios]
    best = {i for _, i in sorted(zip(prios, more, strict=True), key=lambda x: (-x[0], x[1]))[:3]}
    assert {c.id for c in await claim_now(queue, 3)} == best


async def test_claim_never_returns_unfinished_dependencies(queue: JobQueue) -> None:
    async with queue.batch() as b:
        a = b.add("t")
        x = b.add("t", depends_on=[a])
        box = b.container("box", depends_on=[a])
        inner = b.add("t", parent=box)
        after = b.add("t", depends_on=[box])
        other = b.add("other")  # a type this claimer does not ask for
    got = await claim_now(queue, 10)
    assert [c.id for c in got] == [a.id]
    assert await claim_now(queue, 10) == []
    assert await finish(queue, Outcome(a.id, 1, queue.worker_id, "done", result=1))
    got = await claim_now(queue, 10)
    assert sorted(c.id for c in got) == sorted([x.id, inner.id])
    assert await claim_now(queue, 10) == []
    await finish(queue, *(Outcome(c.id, 1, queue.worker_id, "done") for c in got))
    assert [c.id for c in await claim_now(queue, 10)] == [after.id]
    assert (await queue.get(other.id)).state == JobState.READY


# -- leases and fencing -----------------------------------------------------------------------


async def test_expired_lease_is_reclaimed(make_queue: Callable[..., JobQueue]) -> None:
    dead = make_queue(lease_ttl=0.4, heartbeat_interval=0.1)  # claims, then "dies"
    live = make_queue()
    ran: list[int] = []

    @live.handler("t", max_attempts=3)
    async def t(ctx: JobContext) -> str:
        ran.append(ctx.attempt)
        return live.worker_id

    await dead.start()
    await live.start()
    jid = await dead.enqueue("t")
    (c,) = await claim_now(dead, 1)
    assert c.attempt == 1
    await live.run_until_idle()  # waits while the job is running elsewhere, then reclaims
    job = await live.get(jid)
    assert job.state == JobState.DONE and job.result == live.worker_id
    assert ran == [2] and job.attempts == 2
    # the dead worker comes back and tries to finish its old attempt: fenced out
    assert await finish(dead, Outcome(jid, 1, dead.worker_id, "done", result="stale")) == []
    assert (await live.get(jid)).result == live.worker_id


async def test_stale_finalize_changes_nothing(make_queue: Callable[..., JobQueue]) -> None:
    q1 = make_queue(max_attempts=5)
    q2 = make_queue(max_attempts=5)
    await q1.start()
    await q2.start()
    jid = await q1.enqueue("t")
    (c,) = await claim_now(q1, 1)
    before = await row(q1, jid)
    stale = [
        Outcome(jid, c.attempt, q2.worker_id, "done", result="other owner"),
        Outcome(jid, c.attempt - 1, q1.worker_id, "done", result="old attempt"),
        Outcome(jid, c.attempt + 1, q1.worker_id, "failed", error={"type": "X"}),
        Outcome(jid + 999, 1, q1.worker_id, "done"),
    ]
    for o in stale:
        assert await finish(q1, o) == []
        assert await row(q1, jid) == before
    # the holder's own outcome applies exactly once
    mine = Outcome(jid, c.attempt, q1.worker_id, "failed", error={"type": "Boom", "message": ""})
    assert await finish(q1, mine) == [mine]
    after = await row(q1, jid)
    assert after.state == "scheduled" and after.lease_owner is None
    assert await finish(q1, mine) == []  # a repeat of the same finalize
    assert await row(q1, jid) == after

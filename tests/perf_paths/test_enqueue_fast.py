"""The fast enqueue paths: the bulk insert (PostgreSQL: one INSERT ... FROM unnest per level)
must store exactly what the generic path stores, map ids back in order, take its times from
the database clock, and a lone enqueue() on the raw pooled link must fail like SQLAlchemy
would and leave the pool healthy."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from conftest import drop_tables, eventually
from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool
from stmtkit import count_statements, counts

from aiojobqueue import InvalidJobError, JobQueue, JobState, NotJSONError
from aiojobqueue.executor import HandlerSpec


def _row_view(row: Any) -> tuple[Any, ...]:
    return (row.type, row.kind, row.state, row.args, row.group_key, row.weight, row.priority,
            row.pending, row.attempts, row.max_attempts, row.attempt_limit, row.timeout,
            row.key, row.live_key, row.has_dependents, row.error, row.parent_id,
            row.finished_at is None)


async def _rows(q: JobQueue, ids: list[int]) -> dict[int, Any]:
    J = q._t.jobs

    async def read(conn: Any) -> dict[int, Any]:
        return {r.id: r for r in await conn.execute(select(J).where(J.c.id.in_(ids)))}

    return await q._read(read)


async def test_mixed_batch_stores_every_field_in_order(queue: JobQueue, db: str) -> None:
    """Fields that vary between rows (and ones that do not) land on the right row."""
    at = datetime.now(UTC) + timedelta(hours=2)
    async with queue.batch() as b:
        refs = [
            b.add("t", {"i": i}, group=f"g{i % 3}", weight=1 + i % 2, priority=i - 5,
                  timeout=None if i % 4 else 9.5, max_attempts=1 + i % 5,
                  key=f"k{i}" if i % 2 else None,
                  run_after=[None, 30.0, at, timedelta(seconds=-1)][i % 4])
            for i in range(40)
        ]
    ids = [r.id for r in refs]
    assert len(set(ids)) == 40
    rows = await _rows(queue, ids)
    for i, r in enumerate(refs):
        row = rows[r.id]
        state = ["ready", "scheduled", "scheduled", "scheduled"][i % 4]
        assert _row_view(row) == (
            "t", "job", state, {"i": i}, f"g{i % 3}", 1 + i % 2, i - 5, 0, 0, 1 + i % 5,
            1 + i % 5, None if i % 4 else 9.5, f"k{i}" if i % 2 else None,
            f"k{i}" if i % 2 else None, False, None, None, True,
        ), i
        # times from the database clock: run_after relative to the insert's own now
        delta = (row.run_after - row.created_at).total_seconds()
        if i % 4 == 0:
            assert delta == pytest.approx(0, abs=1e-3)
        elif i % 4 == 1:
            assert delta == pytest.approx(30, abs=1e-3)
        elif i % 4 == 2:
            assert abs((row.run_after - at).total_seconds()) < 1e-3
        else:
            assert delta == pytest.approx(-1, abs=1e-3)
    if db == "postgresql":  # one statement, one instant (elsewhere: one per statement shape)
        assert len({row.created_at for row in rows.values()}) == 1


async def test_plain_batch_is_one_insert_on_postgresql(
    make_queue: Callable[..., JobQueue], db: str
) -> None:
    q = make_queue()
    async with q:
        await q.enqueue("t")  # learn the group
        with count_statements(q) as stmts:
            async with q.batch() as b:
                refs = [b.add("t", {"i": i}) for i in range(5000)]
        inserts = [s for s in stmts if "INSERT" in s.upper()]
        if db == "postgresql":
            assert len(inserts) == 1, stmts
        rows = await _rows(q, [refs[0].id, refs[2500].id, refs[-1].id])
        assert [rows[r.id].args for r in (refs[0], refs[2500], refs[-1])] == [
            {"i": 0}, {"i": 2500}, {"i": 4999}]
        assert refs[0].id < refs[2500].id < refs[-1].id


async def test_born_cancelled_rows_through_the_bulk_path(queue: JobQueue) -> None:
    """A failed upstream: the new dependents are inserted cancelled, with error, cause and
    finish time, no live key, alongside ordinary rows of the same level."""
    failed = await queue.enqueue("t", {})
    J = queue._t.jobs

    async def fail(conn: Any) -> None:
        await conn.execute(J.update().where(J.c.id == failed).values(state="failed"))

    await queue._write(fail)
    async with queue.batch() as b:
        dead = [b.add("t", {"d": i}, depends_on=[failed], key=f"dead{i}") for i in range(3)]
        live = [b.add("t", {"l": i}) for i in range(3)]
    rows = await _rows(queue, [r.id for r in dead + live])
    for r in dead:
        row = rows[r.id]
        assert (row.state, row.cancelled_by, row.live_key) == ("cancelled", failed, None)
        assert row.key is not None and row.finished_at is not None
        assert row.error == {"type": "UpstreamFailed", "message": f"upstream {failed} failed"}
    for r in live:
        row = rows[r.id]
        assert (row.state, row.cancelled_by, row.error, row.finished_at) == (
            "ready", None, None, None)


async def test_out_of_range_integers_are_invalid_everywhere(queue: JobQueue) -> None:
    before = await counts(queue)
    for options in ({"priority": 2**31}, {"priority": -(2**31)}, {"weight": 2**31},
                    {"max_attempts": 2**31}):
        with pytest.raises(InvalidJobError):
            await queue.enqueue("t", {}, **options)
    assert await counts(queue) == before
    jid = await queue.enqueue("t", {}, priority=2**31 - 1, weight=2**31 - 1)
    assert (await queue.get(jid)).priority == 2**31 - 1


async def test_lone_enqueue_errors_are_wrapped_and_the_pool_survives(queue: JobQueue) -> None:
    """A database error on the raw path is the SQLAlchemy error the other path raises."""
    await queue.enqueue("t", {})  # the group is known: the next ones take the lone path
    try:
        # PostgreSQL's jsonb refuses \u0000; the others store it
        jid = await queue.enqueue("t", {"s": "a\x00b"})
    except DBAPIError as exc:
        assert queue.engine.dialect.name == "postgresql", exc
    else:
        assert (await queue.get(jid)).args == {"s": "a\x00b"}
    for i in range(20):  # more than the pool's size: no link was left broken or leaked
        assert (await queue.get(await queue.enqueue("t", {"i": i}))).args == {"i": i}


@pytest.mark.parametrize("db", ["postgresql"], indirect=True)  # kills PostgreSQL backends
async def test_lone_enqueue_after_the_server_dropped_the_pool(
    queue: JobQueue, db: str
) -> None:
    await queue.enqueue("t", {})
    before = await counts(queue)
    # Check out a few links at once and note their backends: they go back to the pool.
    held = [await queue.engine.connect() for _ in range(3)]
    pids = [(await c.execute(text("SELECT pg_backend_pid()"))).scalar_one() for c in held]
    for c in held:
        await c.close()
    spare = queue._core.db.ops._spare  # type: ignore[attr-defined]  # the lone path's kept link
    if spare is not None:
        pids.append(spare.driver_connection.get_server_pid())
    killer = create_async_engine(queue.engine.url, poolclass=NullPool)
    try:
        async with killer.connect() as conn:
            await conn.execute(text(
                "SELECT pg_terminate_backend(p) FROM unnest(CAST(:p AS int[])) AS p"
            ), {"p": pids})
    finally:
        await killer.dispose()
    await asyncio.sleep(0.2)
    # A link known dead is replaced before anything is sent; one whose death is noticed only
    # when used fails as an invalidated SQLAlchemy error (and is dropped). Nothing is half
    # done, and the queue goes on.
    done = 0
    for i in range(6):
        try:
            await queue.enqueue("t", {"i": i})
            done += 1
        except DBAPIError as exc:
            assert exc.connection_invalidated, exc
    assert done >= 3  # each dead link fails at most once
    assert await counts(queue) == (before[0] + done, before[1])
    assert (await queue.get(await queue.enqueue("t", {"last": 1}))).state == JobState.READY


async def test_cancelled_lone_enqueues_leave_the_pool_healthy(queue: JobQueue) -> None:
    await queue.enqueue("t", {})
    for _ in range(5):
        task = asyncio.create_task(queue.enqueue("t", {}))
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    ids = await asyncio.gather(*(queue.enqueue("t", {"i": i}) for i in range(10)))
    rows = await _rows(queue, list(ids))
    assert sorted(r.args["i"] for r in rows.values()) == list(range(10))


async def test_awkward_text_round_trips(queue: JobQueue) -> None:
    """JSON text travels inside the bulk statements' parameters (arrays, a JSON document of
    rows): quotes, backslashes, non-ASCII and 4-byte characters come back unchanged."""
    odd = ['"q"', "back\\slash", "ünïcødé", "emoji \U0001f680", "nl\nline", "'", "%s %(x)s"]
    async with queue.batch() as b:
        refs = [b.add("t", {"s": s, "n": [1.5, None, True]}, group=f"g{s}"[:200], key=f"k{s}")
                for s in odd]
    one = await queue.enqueue("t", {"s": odd[3]}, group=odd[2])
    rows = await _rows(queue, [r.id for r in refs] + [one])
    for s, r in zip(odd, refs, strict=True):
        row = rows[r.id]
        assert (row.args, row.group_key, row.key) == ({"s": s, "n": [1.5, None, True]},
                                                      f"g{s}", f"k{s}")
    assert (rows[one].args, rows[one].group_key) == ({"s": odd[3]}, odd[2])


async def test_a_prefix_with_capitals(db_url: str, prefix: str) -> None:
    """The bulk statements are hand-written SQL: the table name must be quoted like
    SQLAlchemy quotes it."""
    caps = "Cap" + prefix
    q = JobQueue(db_url, prefix=caps)
    try:
        async with q:
            async with q.batch() as b:
                refs = [b.add("t", {"i": i}) for i in range(3)]
            one = await q.enqueue("t", {"i": 3})
            one = await q.enqueue("t", {"i": 4})  # the group is known: the lone path
            assert [(await q.get(r.id)).args for r in refs] == [{"i": 0}, {"i": 1}, {"i": 2}]
            assert (await q.get(one)).args == {"i": 4}
    finally:
        if not db_url.startswith("sqlite"):
            await drop_tables(db_url, caps)


async def test_the_lone_path_gives_its_link_back(make_queue: Callable[..., JobQueue]) -> None:
    """A lone enqueue() may keep its link for the next one, but not for long, never more
    than one, and never past close()."""
    q = make_queue()
    async with q:
        engine = q.engine
        pool: Any = engine.pool
        await q.enqueue("t", {})
        await asyncio.gather(*(q.enqueue("t", {"i": i}) for i in range(20)))
        assert pool.checkedout() <= 1
        await eventually(lambda: pool.checkedout() == 0, timeout=5)
        await q.enqueue("t", {})
        passed_in = JobQueue(engine, prefix=q.prefix)  # its close() keeps the engine
        async with passed_in:
            await passed_in.enqueue("t", {})
            await passed_in.enqueue("t", {})
        assert pool.checkedout() <= 1  # q's own spare at most
    assert pool.checkedout() == 0


async def test_large_batches_go_in_bounded_statements(queue: JobQueue) -> None:
    """Big args (past MariaDB's default 16 MB packet in total) and more rows than one bulk
    statement takes: split, every id still maps to its own row."""
    big = "x" * 3_000_000
    async with queue.batch() as b:
        fat = [b.add("t", {"i": i, "pad": big}) for i in range(8)]
    rows = await _rows(queue, [r.id for r in fat])
    assert [rows[r.id].args["i"] for r in fat] == list(range(8))
    assert all(len(rows[r.id].args["pad"]) == len(big) for r in fat)
    async with queue.batch() as b:
        many = [b.add("t", {"i": i}) for i in range(12_345)]
    ids = [r.id for r in many]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    rows = await _rows(queue, [ids[0], ids[9_999], ids[10_000], ids[-1]])
    assert [rows[i].args["i"] for i in (ids[0], ids[9_999], ids[10_000], ids[-1])] == [
        0, 9_999, 10_000, 12_344]


def _spec_of(b: Any, ref: Any) -> tuple[Any, ...]:
    s = b._specs[ref._index]
    return (s.type, s.args, s.group, s.weight, s.priority, s.timeout, s.max_attempts, s.key,
            s.run_after, s.depends_on, s.parent, s.is_container)


@pytest.mark.parametrize(("settings", "valid"), [
    ({}, True), ({"handler": {"timeout": 7, "max_attempts": 5}}, True),
    ({"handler": {"timeout": 2.5}}, True),
    ({"default_group": ""}, False), ({"default_group": "g" * 201}, False),
    ({"default_group": 7}, False), ({"max_attempts": 0}, False), ({"max_attempts": 2.0}, False),
    ({"max_attempts": True}, False), ({"max_attempts": 2**31}, False),
    ({"handler": {"timeout": math.inf}}, False), ({"handler": {"timeout": math.nan}}, False),
    ({"handler": {"max_attempts": 2**31}}, False), ({"handler": {"max_attempts": 1.5}}, False),
])
def test_add_with_default_options_checks_what_the_settings_give(
    settings: dict[str, Any], valid: bool,
) -> None:
    """Batch.add with every per-job option at its default skips the checks that cannot fail,
    but not those of what the queue's and the handler's settings give (group, timeout,
    max_attempts): the same spec, or the same error, as with the full checks (forced here by
    an empty list for depends_on, which changes nothing else)."""
    opts = dict(settings)
    handler = opts.pop("handler", None)
    q = JobQueue("sqlite+aiosqlite:///unused.db", **opts)
    if handler is not None:
        q._handlers["t"] = HandlerSpec(None, handler.get("timeout"),  # type: ignore[arg-type]
                                       handler.get("max_attempts"))
    outcomes = []
    for extra in ({}, {"depends_on": []}):
        b = q.batch()
        try:
            outcomes.append(("ok", _spec_of(b, b.add("t", {"x": 1.5}, **extra))))
        except InvalidJobError as exc:
            outcomes.append(("error", f"{exc.__class__.__name__}: {exc}"))
    assert outcomes[0] == outcomes[1]
    assert (outcomes[0][0] == "ok") == valid


def test_add_with_default_options_still_checks_type_and_args() -> None:
    q = JobQueue("sqlite+aiosqlite:///unused.db")
    b = q.batch()
    for bad in ("", "x" * 201, None, 3):
        with pytest.raises(InvalidJobError, match="job type"):
            b.add(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidJobError, match="args must be a dict"):
        b.add("t", [1])  # type: ignore[arg-type]
    for args in ({"x": math.nan}, {"s": {1}}):
        with pytest.raises(NotJSONError, match="args of 't' is not JSON-serializable"):
            b.add("t", args)
    assert b._specs == []
    ref = b.add("t", {"ts": 0.0})
    assert _spec_of(b, ref) == ("t", '{"ts": 0.0}', "default", 1, 0, None, 3, None, None, [],
                                None, False)


async def test_a_bulk_load_chunk_is_one_statement_of_its_own(queue: JobQueue, db: str) -> None:
    """Up to one bulk statement's worth of plain jobs (a known group, no key, edge or parent)
    goes on the lone path where the dialect has one (PostgreSQL): no transaction around it,
    so none of SQLAlchemy's BEGIN / INSERT / COMMIT; one more job than that takes the
    transaction. Either way every id maps to its own row, in order."""
    from aiojobqueue.insert import BULK_ROWS

    for _ in range(2):  # the default group is known (seen committed) from here on
        await queue.enqueue("t", {})
    for n, lone in ((1_000, db == "postgresql"), (BULK_ROWS + 1, False)):
        with count_statements(queue) as stmts:
            async with queue.batch() as b:
                refs = [b.add("t", {"i": i}) for i in range(n)]
        assert (len(stmts) == 0) == lone, (n, stmts[:3])
        ids = [r.id for r in refs]
        assert ids == sorted(ids) and len(set(ids)) == n
        rows = await _rows(queue, ids[:: n // 7])
        assert [rows[i].args["i"] for i in ids[:: n // 7]] == list(range(0, n, n // 7))

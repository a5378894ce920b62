"""SyncQueue on every database: enqueue and batch from code that is not async, on its own
connections or inside the caller's transaction (a SQLAlchemy sync Connection or Session: the
jobs exist iff it commits), the same errors as JobQueue's with nothing written, keys and
DAGs as JobQueue has them, many threads at once, and jobs a worker then runs.

The tests are async only to run a JobQueue worker in the same process; every SyncQueue call
blocks the test's event loop, which is the point: SyncQueue needs no loop of its caller's.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session

from aiojobqueue import (
    ConfigurationError,
    InvalidJobError,
    InvalidStateError,
    JobCancelled,
    JobContext,
    JobFailed,
    JobNotFoundError,
    JobQueue,
    JobState,
    SyncQueue,
)
from aiojobqueue.dialects.urls import sync_url
from aiojobqueue.schema import build_tables


@pytest.fixture
def sq(db_url: str, prefix: str, queue: JobQueue) -> Iterator[SyncQueue]:
    """A SyncQueue on the database under test (the ``queue`` fixture's tables)."""
    with SyncQueue(db_url, prefix=prefix) as q:
        yield q


@pytest.fixture
def app_engine(db_url: str) -> Iterator[Engine]:
    """The application's own sync engine (as a Flask or Django app has one)."""
    engine = create_engine(sync_url(db_url))
    yield engine
    engine.dispose()


def count(engine: Engine, prefix: str) -> int:
    jobs = build_tables(prefix).jobs
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(jobs)).scalar_one())


def register(queue: JobQueue) -> Any:
    @queue.handler("add")
    async def add(ctx: JobContext, a: int, b: int = 0) -> int:
        return a + b

    @queue.handler("t")
    async def t(ctx: JobContext, **args: Any) -> None:
        return None

    @queue.handler("boom", max_attempts=1)
    async def boom(ctx: JobContext) -> None:
        raise RuntimeError("no")

    return add


# -- enqueue, read, wait ----------------------------------------------------------------------
async def test_enqueue_runs_and_reads_back(queue: JobQueue, sq: SyncQueue) -> None:
    add = register(queue)
    jid = sq.enqueue("add", {"a": 2, "b": 3})
    via_handler = sq.enqueue(add, {"a": 1})
    bad = sq.enqueue("boom")
    assert sq.get(jid).state == JobState.READY
    with pytest.raises(TimeoutError):
        sq.wait(jid, timeout=0.1)
    await queue.run_until_idle()
    assert sq.wait(jid) == 5 and sq.wait(via_handler, timeout=5) == 1
    job = sq.get(jid)
    assert job.state == JobState.DONE and job.args == {"a": 2, "b": 3} and job.result == 5
    with pytest.raises(JobFailed):
        sq.wait(bad)
    assert sq.explain(bad) == await queue.explain(bad) and sq.explain(bad).reasons
    sq.retry(bad)
    assert sq.get(bad).state == JobState.READY


async def test_batch_builds_a_dag(queue: JobQueue, sq: SyncQueue) -> None:
    register(queue)
    with sq.batch() as b:
        site = b.container("site", group="tenant-a")
        one = b.add("add", {"a": 1}, parent=site)
        two = b.add("add", {"a": 2}, parent=site, depends_on=[one])
        after = b.add("add", {"a": 3}, depends_on=[site])
    assert sq.get(two.id).depends_on == (one.id,)
    assert sq.get(one.id).group == "tenant-a"  # children take their container's group
    await queue.run_until_idle()
    assert [sq.get(r.id).state for r in (site, one, two, after)] == [JobState.DONE] * 4


async def test_keys_cancel_and_delays(queue: JobQueue, sq: SyncQueue) -> None:
    first = sq.enqueue("t", key="nightly")
    assert sq.enqueue("t", key="nightly") == first  # a live key: the existing job
    assert await queue.enqueue("t", key="nightly") == first
    later = sq.enqueue("t", run_after=timedelta(hours=1))
    assert sq.get(later).state == JobState.SCHEDULED
    sq.cancel(first)
    with pytest.raises(JobCancelled):
        sq.wait(first)
    assert sq.enqueue("t", key="nightly") != first  # a terminal key is free again


# -- the caller's transaction -----------------------------------------------------------------
async def test_enqueue_in_a_transaction_that_rolls_back_leaves_nothing(
    queue: JobQueue, sq: SyncQueue, app_engine: Engine, prefix: str
) -> None:
    before = count(app_engine, prefix)
    with app_engine.connect() as conn, conn.begin() as tx:
        jid = sq.enqueue("t", {"x": 1}, connection=conn)
        with sq.batch(connection=conn) as b:
            up = b.add("t")
            b.add("t", depends_on=[up, jid])
        # inside the transaction the caller sees its jobs
        assert conn.execute(select(func.count()).select_from(
            build_tables(prefix).jobs)).scalar_one() == before + 3
        tx.rollback()
    assert count(app_engine, prefix) == before
    with pytest.raises(JobNotFoundError):
        sq.get(jid)
    with Session(app_engine) as session:  # a Session rolled back (closed uncommitted)
        sid = sq.enqueue("t", connection=session)
    with pytest.raises(JobNotFoundError):
        sq.get(sid)
    assert count(app_engine, prefix) == before


async def test_enqueue_in_a_transaction_that_commits_runs(
    queue: JobQueue, sq: SyncQueue, app_engine: Engine
) -> None:
    register(queue)
    with app_engine.begin() as conn:
        jid = sq.enqueue("add", {"a": 20, "b": 1}, connection=conn)
        with sq.batch(connection=conn) as b:
            box = b.container("box")
            kid = b.add("add", {"a": 1}, parent=box, key="k-1")
            b.container("empty")  # done at once: nothing in it
            then = b.add("add", {"a": 2}, depends_on=[box, jid])
    with Session(app_engine) as session, session.begin():
        sid = sq.enqueue("add", {"a": 7}, connection=session)
    # a key taken inside a committed transaction is live for everyone
    assert sq.enqueue("add", {"a": 1}, key="k-1") == kid.id
    await queue.run_until_idle()
    assert sq.wait(jid) == 21 and sq.wait(sid) == 7 and sq.wait(then.id) == 2
    assert sq.get(box.id).state == JobState.DONE


async def test_a_sync_connection_on_jobqueue_or_an_async_one_on_syncqueue_is_refused(
    sq: SyncQueue, queue: JobQueue
) -> None:
    async with queue.engine.connect() as aconn:
        with pytest.raises(InvalidJobError, match="Connection or Session"):
            sq.batch(connection=aconn)  # type: ignore[arg-type]


# -- the same errors as JobQueue ---------------------------------------------------------------
BAD: list[tuple[str, dict[str, Any]]] = [
    ("", {}),
    ("add", {"args": ["not", "a", "dict"]}),
    ("add", {"args": {"a": object()}}),
    ("add", {"args": {"b": 1}}),  # the handler needs a
    ("add", {"args": {"a": 1, "c": 2}}),
    ("t", {"weight": 0}),
    ("t", {"priority": 2**40}),
    ("t", {"timeout": -1}),
    ("t", {"max_attempts": 0}),
    ("t", {"key": ""}),
    ("t", {"run_after": "soon"}),
    ("t", {"depends_on": [10**12]}),
    ("t", {"depends_on": [0]}),
    ("t", {"parent": 10**12}),
    ("t", {"group": ""}),
]


async def test_bad_input_fails_as_on_jobqueue_and_writes_nothing(
    queue: JobQueue, sq: SyncQueue, app_engine: Engine, prefix: str
) -> None:
    register(queue)
    sq_register = JobQueue("sqlite:///unused.db")  # the SyncQueue's process knows the handler
    add = register(sq_register)
    existing = sq.enqueue("t")
    before = count(app_engine, prefix)

    async def on_jobqueue(type_: str, kw: dict[str, Any]) -> BaseException:
        with pytest.raises(Exception) as ei:
            await queue.enqueue(type_, kw.pop("args", None), **kw)
        return ei.value

    def on_syncqueue(type_: Any, kw: dict[str, Any], conn: Any = None) -> BaseException:
        with pytest.raises(Exception) as ei:
            sq.enqueue(type_, kw.pop("args", None), connection=conn, **kw)
        return ei.value

    for type_, kw in BAD:
        want = await on_jobqueue(type_, dict(kw))
        typed = add if type_ == "add" else type_
        for conn_kind in ("own", "connection"):
            if conn_kind == "own":
                got = on_syncqueue(typed, dict(kw))
            else:
                with app_engine.begin() as conn:
                    got = on_syncqueue(typed, dict(kw), conn)
            assert (type(got), str(got)) == (type(want), str(want)), (type_, kw, conn_kind)
    assert count(app_engine, prefix) == before
    # a cycle through a container, and an id that is no job
    with pytest.raises(Exception) as a_cycle:
        async with queue.batch() as ab:
            s = ab.container("site")
            r = ab.add("report", depends_on=[s])
            ab.add("fetch", parent=s, depends_on=[r])
    with pytest.raises(type(a_cycle.value), match=re.escape(str(a_cycle.value))), sq.batch() as b:
        s2 = b.container("site")
        r2 = b.add("report", depends_on=[s2])
        b.add("fetch", parent=s2, depends_on=[r2])
    for call in ("get", "cancel", "retry", "explain"):
        for bad_id in (0, -1, 10**12, "1"):
            with pytest.raises(JobNotFoundError) as s_err:
                getattr(sq, call)(bad_id)
            with pytest.raises(JobNotFoundError) as a_err:
                await getattr(queue, call)(bad_id)
            assert str(s_err.value) == str(a_err.value)
    with pytest.raises(InvalidStateError):
        sq.retry(existing)  # ready: not failed or cancelled
    assert count(app_engine, prefix) == before


def test_bad_urls_are_configuration_errors(tmp_path: Any) -> None:
    for url in ("nonsense", "", "sqlite://", "sqlite:///:memory:"):
        with pytest.raises(ConfigurationError):
            SyncQueue(url)


async def test_every_url_form_reaches_the_same_database(
    db_url: str, prefix: str, queue: JobQueue, app_engine: Engine, db: str
) -> None:
    plain = db_url.replace("+aiosqlite", "").replace("+asyncpg", "").replace("+aiomysql", "")
    forms: list[Any] = [db_url, plain, sync_url(db_url), app_engine, queue.engine]
    if db == "postgresql":
        forms.append(plain.replace("postgresql://", "postgres://"))
    ids = []
    for form in forms:
        with SyncQueue(form, prefix=prefix) as q:
            ids.append(q.enqueue("t"))
    for jid in ids:
        assert (await queue.get(jid)).type == "t"


# -- threads ----------------------------------------------------------------------------------
async def test_many_threads_enqueue_at_once(
    queue: JobQueue, sq: SyncQueue, app_engine: Engine, prefix: str
) -> None:
    register(queue)
    before = count(app_engine, prefix)
    threads, each = 8, 25
    start = threading.Barrier(threads)

    def work(n: int) -> tuple[list[int], int, list[int]]:
        start.wait()
        mine = [sq.enqueue("t", {"thread": n, "i": i}) for i in range(each)]
        keyed = sq.enqueue("t", key="one-for-all")  # all threads race on one key
        # and transactional batches meanwhile
        with app_engine.begin() as conn, sq.batch(connection=conn) as b:
            refs = [b.add("t", {"thread": n, "tx": i}) for i in range(3)]
        return mine, keyed, [r.id for r in refs]

    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(work, range(threads)))
    plain = [i for mine, _, tx in results for i in mine + tx]
    assert len(set(plain)) == len(plain) == threads * (each + 3)
    assert len({keyed for _, keyed, _ in results}) == 1
    assert count(app_engine, prefix) == before + len(plain) + 1
    await queue.run_until_idle()
    assert all(sq.get(i).state == JobState.DONE for i in plain[:: each])


async def test_usable_from_a_thread_of_an_app_whose_loop_runs_elsewhere(
    queue: JobQueue, sq: SyncQueue
) -> None:
    # this test's own loop is running: SyncQueue needs none of it
    register(queue)
    jid = sq.enqueue("add", {"a": 4})
    await queue.run_until_idle()
    assert sq.wait(jid) == 4


def test_close_is_idempotent_and_final(tmp_path: Any) -> None:
    q = SyncQueue(f"sqlite:///{tmp_path}/jobs.db")
    jid = q.enqueue("t")
    assert q.get(jid).type == "t"
    q.close()
    q.close()
    fails: list[Callable[[], Any]] = [lambda: q.enqueue("t"), lambda: q.get(jid)]
    for call in fails:
        with pytest.raises(Exception, match="closed"):
            call()


def forked_child(q: SyncQueue, parent_job: int, out: Any) -> None:
    jid = q.enqueue("t", {"from": "child"})
    out.put((q.get(parent_job).type, q.get(jid).args))


def test_a_forked_child_uses_the_parents_syncqueue(tmp_path: Any) -> None:
    """gunicorn and multiprocessing fork after the app made its SyncQueue: the child has no
    loop thread and must not use the parent's connections (it would hang or corrupt them)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    with SyncQueue(f"sqlite:///{tmp_path}/jobs.db") as q:
        parent_job = q.enqueue("t")  # the loop and the pools are in use before the fork
        out = ctx.Queue()
        child = ctx.Process(target=forked_child, args=(q, parent_job, out))
        child.start()
        child.join(60)
        assert child.exitcode == 0
        assert out.get(timeout=5) == ("t", {"from": "child"})
        assert q.enqueue("t") > parent_job  # the parent's queue still works


@pytest.mark.parametrize("db", ["sqlite"])
async def test_sqlite_a_callers_transaction_is_the_writer_before_the_insert_reads(
    db_url: str, prefix: str, sq: SyncQueue, queue: JobQueue, app_engine: Engine
) -> None:
    """On SQLite the caller's connection begins no write transaction until its first write:
    the insert's reads (an upstream's state) could go stale before its INSERT, and a job
    depending on one that finished meanwhile would wait forever. No other connection may
    write from the insert's first read on, for SyncQueue's and JobQueue's inserts alike."""
    import sqlite3

    path = app_engine.url.database
    assert path is not None
    up = sq.enqueue("t")
    other = sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)
    seen: list[str] = []

    def try_to_write(sql: str) -> None:
        if sql.lstrip().upper().startswith("SELECT") and f"{prefix}jobs" in sql:
            try:
                other.execute("BEGIN IMMEDIATE")
                other.execute("ROLLBACK")
                seen.append("another writer got in")
            except sqlite3.OperationalError:
                seen.append("locked")

    with app_engine.connect() as conn:
        raw: Any = conn.connection.driver_connection
        raw.set_trace_callback(try_to_write)
        jid = sq.enqueue("t", depends_on=[up], connection=conn)
        raw.set_trace_callback(None)
        conn.commit()
    assert seen and set(seen) == {"locked"}, seen
    seen.clear()
    async_engine = create_async_engine(db_url)  # the same on JobQueue's connection= path
    try:
        async with async_engine.connect() as aconn:
            araw: Any = (await aconn.get_raw_connection()).driver_connection
            await araw.set_trace_callback(try_to_write)
            async with queue.batch(connection=aconn) as b:
                b.add("t", depends_on=[jid])
            await araw.set_trace_callback(None)
            await aconn.commit()
    finally:
        await async_engine.dispose()
        other.close()
    assert seen and set(seen) == {"locked"}, seen


@pytest.mark.parametrize("db", ["pgbouncer"])
async def test_behind_a_transaction_pooler(queue: JobQueue, sq: SyncQueue) -> None:
    """PgBouncer in transaction mode hands each transaction any server connection: a
    statement prepared by name on one (psycopg 3 prepares what it runs 5 times) is missing
    on the next. Threads at once, so that the pooler really mixes its connections."""
    register(queue)

    def work(n: int) -> list[int]:
        ids = [sq.enqueue("t", {"n": n, "i": i}) for i in range(30)]
        for i in range(5):
            with sq.batch() as b:
                refs = [b.add("t", {"n": n, "b": i, "j": j}) for j in range(3)]
            ids += [r.id for r in refs]
            ids.append(sq.enqueue("t", {"n": n}, key=f"k-{n}-{i}"))
        return ids

    with ThreadPoolExecutor(6) as pool:
        ids = [i for part in pool.map(work, range(6)) for i in part]
    assert len(set(ids)) == len(ids) == 6 * (30 + 5 * 4)
    assert sq.get(ids[-1]).state == JobState.READY

"""The MySQL/MariaDB bell: one watch of a queue (the baton holder) sleeping on the server on a
connection of its own, ended by the ringer's KILL QUERY, the others waiting for the baton in
GET_LOCK; polling where KILL or the connection is refused.

The watches here sleep LONG = 30 s and wait WAIT = 30 s for the baton, so a wake within a
fraction of a second can only have come from a KILL sent after the ring committed (an early
KILL would find the counter unchanged and the holder would sleep on) or from the baton
passing on. The producers are other processes (their own interpreter and connections:
another host as far as the server can tell).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

import aiojobqueue.dialects.mysql_bell as mb
import aiojobqueue.dialects.mysql_watch as mw
from aiojobqueue import JobQueue

pytestmark = pytest.mark.parametrize("db", ["mariadb"], indirect=True)

#: enqueues "t" N times, GAP s apart, printing the wall clock before each (the KILL goes
#: out before enqueue() returns: the wake may come first)
PRODUCER = """
import asyncio, sys, time
from aiojobqueue import JobQueue
async def main(url, prefix, n, gap):
    async with JobQueue(url, prefix=prefix) as q:
        for _ in range(n):
            await asyncio.sleep(gap)
            print(time.time(), flush=True)
            await q.enqueue("t", {})
asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
"""
#: the same through SyncQueue (pymysql: the same hooks on a sync engine)
SYNC_PRODUCER = """
import sys, time
from aiojobqueue import SyncQueue
with SyncQueue(sys.argv[1], prefix=sys.argv[2]) as q:
    for _ in range(int(sys.argv[3])):
        time.sleep(float(sys.argv[4]))
        print(time.time(), flush=True)
        q.enqueue("t", {})
"""
#: what "at once" means on a loaded 2-core box (the watch sleeps 30 s)
PROMPT = 0.5


def _env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}


async def _produce(url: str, prefix: str, n: int, gap: float, code: str = PRODUCER
                   ) -> tuple[list[float], str]:
    """(wall clock before each enqueue, the producer's stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, url, prefix, str(n), str(gap), env=_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    return [float(x) for x in out.decode().split()], err.decode()


async def _cold_holder(q: JobQueue) -> int | None:
    """The connection id holding the queue's cold lock (the one watch asleep on the server)."""
    meta = q._started().db.ops.t.meta.name
    async with q.engine.connect() as conn:
        got = (await conn.exec_driver_sql(
            f"SELECT IS_USED_LOCK({mb.lock_name(meta, 'cold')})")).scalar()
    return None if got is None else int(got)


async def _sleepers(q: JobQueue) -> list[tuple[int, str]]:
    """(id, statement) of the server's threads in SLEEP() or GET_LOCK() of this queue."""
    meta = q._started().db.ops.t.meta.name
    async with q.engine.connect() as conn:
        rows = (await conn.exec_driver_sql(
            "SELECT ID, INFO FROM information_schema.PROCESSLIST WHERE INFO LIKE %s",
            (f"%`{meta}`%",))).all()
    return [(int(r[0]), str(r[1])) for r in rows if "SLEEP(" in r[1] or "GET_LOCK(" in r[1]]


class Watching:
    """A queue's bell watch running in the background, and the wall clock of its wakes."""

    def __init__(self, q: JobQueue) -> None:
        self.watch: Any = q._started().db.ops.listener(q.engine)
        self.woke: list[float] = []
        self.task = asyncio.create_task(self.watch.run(lambda _p: self.woke.append(time.time())))

    def first_after(self, t: float) -> float:
        return min((w for w in self.woke if w >= t), default=float("inf"))

    async def stop(self) -> None:
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task


@pytest.fixture
def long_sleeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Watches that sleep (and wait for the baton) 30 s once past their warm 0.3 s."""
    monkeypatch.setattr(mw, "LONG", 30.0)
    monkeypatch.setattr(mw, "WAIT", 30.0)
    monkeypatch.setattr(mw, "WARM", 0.3)
    monkeypatch.setattr(mb, "THROTTLE", 0.1)


@pytest_asyncio.fixture
async def watching(make_queue: Callable[..., JobQueue], long_sleeps: None
                   ) -> AsyncIterator[tuple[JobQueue, Watching]]:
    q = make_queue()
    async with q:
        w = Watching(q)
        await asyncio.sleep(1.0)  # connected, past its warm time: sleeping LONG
        try:
            yield q, w
        finally:
            await w.stop()


async def test_a_sleeping_watch_is_woken_by_another_process(
    watching: tuple[JobQueue, Watching], db_url: str, prefix: str
) -> None:
    _q, w = watching
    done, _err = await _produce(db_url, prefix, 4, 0.6)
    await asyncio.sleep(PROMPT)
    late = [w.first_after(t) - t for t in done]
    assert max(late) < PROMPT, late
    assert w.watch.kills >= len(done)
    assert w.watch.misses == 0 and not w.watch.polling


async def test_the_watch_keeps_one_connection_across_kills(
    watching: tuple[JobQueue, Watching], db_url: str, prefix: str
) -> None:
    """KILL QUERY ends the watch's statement, never its connection: after several wakes the
    watch still runs on the one connection it made (the server's CONNECTION_ID unchanged,
    and that thread is the one holding the cold lock), and it is none of the queue's pooled
    connections."""
    q, w = watching
    first = w.watch.thread
    assert first is not None and w.watch.connects == 1
    assert q.engine.sync_engine.pool.checkedout() == 0  # (the watch holds none of them)
    done, _err = await _produce(db_url, prefix, 4, 0.6)
    await asyncio.sleep(PROMPT)
    assert max(w.first_after(t) - t for t in done) < PROMPT
    assert w.watch.kills >= len(done)
    assert w.watch.connects == 1 and w.watch.thread == first
    await asyncio.sleep(0.6)  # cold again
    assert await _cold_holder(q) == first


async def test_a_syncqueue_enqueue_wakes_a_sleeping_watch(
    watching: tuple[JobQueue, Watching], db_url: str, prefix: str
) -> None:
    _q, w = watching
    done, _err = await _produce(db_url, prefix, 2, 0.6, SYNC_PRODUCER)
    await asyncio.sleep(PROMPT)
    assert max(w.first_after(t) - t for t in done) < PROMPT
    assert w.watch.kills >= len(done)


async def test_a_rolled_back_transaction_wakes_nothing(
    watching: tuple[JobQueue, Watching]
) -> None:
    q, w = watching
    kills = w.watch.kills
    async with q.engine.connect() as conn:
        await conn.begin()
        async with q.batch(connection=conn) as batch:
            batch.add("t", {})
        await conn.rollback()
    await asyncio.sleep(1.0)
    assert w.watch.kills == kills
    t0 = time.time()
    await q.enqueue("t", {})  # (this process: its own engine rings too)
    await asyncio.sleep(PROMPT)
    assert w.first_after(t0) - t0 < PROMPT
    assert w.watch.kills == kills + 1


@pytest_asyncio.fixture
async def other_user(db_url: str) -> AsyncIterator[str]:
    """The URL of a database user of its own (unique name, dropped afterwards) that may
    read and write the test database and see every thread (PROCESS), but not end another
    user's statements (no CONNECTION ADMIN / SUPER)."""
    name, pw = f"ajq_{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
    url = make_url(db_url)
    root = create_async_engine(url)
    try:
        async with root.begin() as conn:
            await conn.exec_driver_sql(f"CREATE USER '{name}'@'%%' IDENTIFIED BY '{pw}'")
            await conn.exec_driver_sql(
                f"GRANT SELECT, INSERT, UPDATE, DELETE ON `{url.database}`.* TO '{name}'@'%%'")
            await conn.exec_driver_sql(f"GRANT PROCESS ON *.* TO '{name}'@'%%'")
        yield url.set(username=name, password=pw).render_as_string(hide_password=False)
    finally:
        async with root.begin() as conn:
            await conn.exec_driver_sql(f"DROP USER IF EXISTS '{name}'@'%%'")
        await root.dispose()


async def test_a_refused_kill_falls_back_to_polling(
    make_queue: Callable[..., JobQueue], other_user: str, prefix: str,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """A producer connected as another user cannot KILL the watch: each of its rings is
    noticed when the watch's sleep runs out, and after MISSES of them the watch polls (and
    says so once); the producer says once that its KILL was refused."""
    monkeypatch.setattr(mw, "LONG", 0.6)
    monkeypatch.setattr(mw, "WARM", 0.1)
    monkeypatch.setattr(mb, "THROTTLE", 0.05)
    caplog.set_level(logging.WARNING, "aiojobqueue.listener")
    q = make_queue()
    async with q:
        w = Watching(q)
        try:
            await asyncio.sleep(1.0)
            done, err = await _produce(other_user, prefix, 3 + mw.MISSES, 1.0)
            await asyncio.sleep(mw.LONG + 0.2)
        finally:
            await w.stop()
    late = [w.first_after(t) - t for t in done]
    assert max(late[: mw.MISSES]) < mw.LONG + PROMPT, late  # the sleep ran out: seen then
    assert max(late[mw.MISSES :]) < PROMPT, late  # polling now
    assert w.watch.polling and w.watch.kills == 0 and w.watch.misses >= mw.MISSES
    said = [r for r in caplog.records if "not woken by KILL QUERY" in r.getMessage()]
    assert len(said) == 1
    assert err.count("KILL QUERY of the bell watch") == 1, err


@pytest_asyncio.fixture
async def one_connection_user(db_url: str) -> AsyncIterator[str]:
    """The URL of a database user of its own allowed one connection at a time
    (MAX_USER_CONNECTIONS 1)."""
    name, pw = f"ajq_{uuid.uuid4().hex[:10]}", uuid.uuid4().hex
    url = make_url(db_url)
    root = create_async_engine(url)
    try:
        async with root.begin() as conn:
            await conn.exec_driver_sql(f"CREATE USER '{name}'@'%%' IDENTIFIED BY '{pw}' "
                                       "WITH MAX_USER_CONNECTIONS 1")
            await conn.exec_driver_sql(
                f"GRANT SELECT, INSERT, UPDATE, DELETE ON `{url.database}`.* TO '{name}'@'%%'")
        yield url.set(username=name, password=pw).render_as_string(hide_password=False)
    finally:
        async with root.begin() as conn:
            await conn.exec_driver_sql(f"DROP USER IF EXISTS '{name}'@'%%'")
        await root.dispose()


async def test_a_refused_connection_falls_back_to_polling(
    make_queue: Callable[..., JobQueue], one_connection_user: str, db_url: str, prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A user at its connection limit (the queue's pool holds its only connection): the
    watch's own connection is refused (1226), the watch says so once, polls the bell on the
    pool, and another process's enqueues still wake it promptly; it keeps trying without
    failing."""
    caplog.set_level(logging.DEBUG, "aiojobqueue.listener")
    async with make_queue():  # the tables, as the test's user (the fixture drops them)
        pass
    q = JobQueue(one_connection_user, prefix=prefix, pool_size=1)
    async with q:
        async with q.engine.connect() as conn:  # the pool's one connection, kept open
            await conn.exec_driver_sql("SELECT 1")
        w = Watching(q)
        try:
            await asyncio.sleep(1.0)
            assert w.watch.polling and w.watch.connects == 0
            done, _err = await _produce(db_url, prefix, 3, 0.5)
            await asyncio.sleep(PROMPT)
            assert not w.task.done()
        finally:
            await w.stop()
    assert max(w.first_after(t) - t for t in done) < PROMPT
    warned = [r for r in caplog.records
              if r.levelno == logging.WARNING and "cannot connect" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]


async def test_the_watch_connects_with_the_engines_connect_args(
    db_url: str, prefix: str, long_sleeps: None
) -> None:
    """The watch's connection is made by the queue's engine: an engine whose URL names a
    user that does not exist and whose connect_args name the real one still wakes."""
    url = make_url(db_url)
    engine = create_async_engine(url.set(username="ajq_nobody"),
                                 connect_args={"user": url.username or "root"})
    q = JobQueue(engine, prefix=prefix)
    try:
        async with q:
            w = Watching(q)
            try:
                await asyncio.sleep(1.0)
                done, _err = await _produce(db_url, prefix, 2, 0.5)
                await asyncio.sleep(PROMPT)
            finally:
                await w.stop()
            assert max(w.first_after(t) - t for t in done) < PROMPT
            assert w.watch.kills >= 2
    finally:
        from tests.conftest import drop_tables

        await drop_tables(db_url, prefix)
        await engine.dispose()


@pytest_asyncio.fixture
async def fleet(make_queue: Callable[..., JobQueue], long_sleeps: None
                ) -> AsyncIterator[tuple[JobQueue, list[Watching]]]:
    """Four watches of one queue (four connections of their own), settled: one holder."""
    q = make_queue()
    async with q:
        ws = [Watching(q) for _ in range(4)]
        await asyncio.sleep(1.0)
        try:
            yield q, ws
        finally:
            for w in ws:
                await w.stop()


async def test_one_watch_of_a_fleet_sleeps_the_others_wait_for_the_baton(
    fleet: tuple[JobQueue, list[Watching]], db_url: str, prefix: str
) -> None:
    """Of four idle watches exactly one holds the baton and sleeps on the server (it holds
    the cold lock); the other three wait in GET_LOCK. A ring from another process wakes all
    four at once, and afterwards again exactly one sleeps."""
    q, ws = fleet
    for _round in range(2):
        holders = [w for w in ws if w.watch.holding]
        assert len(holders) == 1
        assert await _cold_holder(q) == holders[0].watch.thread
        seen = await _sleepers(q)
        assert [i for i, sql in seen if "SLEEP(" in sql] == [holders[0].watch.thread]
        assert sorted(i for i, sql in seen if "GET_LOCK(" in sql) == sorted(
            w.watch.thread for w in ws if w is not holders[0])
        done, _err = await _produce(db_url, prefix, 1, 0.1)
        await asyncio.sleep(PROMPT)
        late = [w.first_after(done[0]) - done[0] for w in ws]
        assert max(late) < PROMPT, late
        await asyncio.sleep(0.6)  # cold again
    assert all(w.watch.connects == 1 for w in ws)


async def test_the_holders_death_hands_the_baton_over(
    fleet: tuple[JobQueue, list[Watching]], db_url: str, prefix: str
) -> None:
    """The holder's connection dies (KILL CONNECTION from outside): the server frees its
    locks, a waiter takes the baton and sleeps in its place, and another process's ring wakes
    the survivors at once."""
    q, ws = fleet
    holder = next(w for w in ws if w.watch.holding)
    dead = holder.watch.thread
    async with q.engine.connect() as conn:
        await conn.exec_driver_sql(f"KILL CONNECTION {dead}")
    await holder.stop()  # (this process's side of it: it would reconnect otherwise)
    rest = [w for w in ws if w is not holder]
    await asyncio.sleep(0.8)
    new = await _cold_holder(q)
    assert new is not None and new != dead and new in {w.watch.thread for w in rest}
    done, _err = await _produce(db_url, prefix, 2, 0.6)
    await asyncio.sleep(PROMPT)
    late = [w.first_after(t) - t for w in rest for t in done]
    assert max(late) < PROMPT, late
    ws[:] = rest  # (the fixture stops the others)


def _ring_after(monkeypatch: pytest.MonkeyPatch, q: JobQueue, sql_part: str) -> list[float]:
    """Make the watches ring the bell themselves (an enqueue on the queue's pool, committed and
    its KILL sent) right after their first statement containing ``sql_part``, before their
    next statement: the window between a look and the wait. Returns [wall clock of it]."""
    rang: list[float] = []
    real = mw.BellWatch._run

    async def run(self: Any, conn: Any, sql: str, *args: Any, **kw: Any) -> Any:
        out = await real(self, conn, sql, *args, **kw)
        if sql_part in sql and not rang:
            rang.append(time.time())
            await q.enqueue("t", {})
        return out

    monkeypatch.setattr(mw.BellWatch, "_run", run)
    return rang


async def test_a_ring_between_taking_the_cold_lock_and_sleeping_is_not_lost(
    make_queue: Callable[..., JobQueue], long_sleeps: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ring that commits after the holder took its cold lock but before its sleep statement
    starts (its KILL, if any, lands between two statements and is dropped) is seen by the
    sleep statement's own read: the holder does not sleep its 30 s."""
    q = make_queue()
    async with q:
        rang = _ring_after(monkeypatch, q, "GET_LOCK(CONCAT('ajqc'")
        w = Watching(q)
        try:
            await asyncio.sleep(1.5)
        finally:
            await w.stop()
    assert rang, "the holder never went cold"
    assert w.first_after(rang[0]) - rang[0] < PROMPT


async def test_a_ring_while_the_baton_is_between_holders_is_not_lost(
    make_queue: Callable[..., JobQueue], long_sleeps: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ring that commits after the holder let go of the baton and before anyone took it
    (nobody holds the cold lock: no KILL at all) is seen by the next holder's first look."""
    q = make_queue()
    async with q:
        ws = [Watching(q), Watching(q)]
        try:
            await asyncio.sleep(1.0)
            rang = _ring_after(monkeypatch, q, "RELEASE_ALL_LOCKS")
            await q.enqueue("t", {})  # the holder wakes and lets go; then the ring
            await asyncio.sleep(1.0)
        finally:
            for w in ws:
                await w.stop()
    assert rang
    late = [w.first_after(rang[0]) - rang[0] for w in ws]
    assert max(late) < PROMPT, late


async def test_the_two_step_kill_wakes_too(watching: tuple[JobQueue, Watching]) -> None:
    """Where the server wants a number after KILL QUERY (not ``IS_USED_LOCK(...)``), the
    ringer asks who holds the cold lock first and KILLs that id: the sleeper wakes as fast."""
    q, w = watching
    bell = mb._bell_of(q.engine.sync_engine.pool)
    bell.combined = False
    kills = w.watch.kills
    for _ in range(2):
        t0 = time.time()
        await q.enqueue("t", {})
        await asyncio.sleep(PROMPT)
        assert w.first_after(t0) - t0 < PROMPT
        await asyncio.sleep(0.5)  # cold again
    assert w.watch.kills == kills + 2 and bell.kills >= 2 and not bell.combined


@pytest.fixture
def long_warm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Watches that stay warm for a minute after a ring and, warm, poll only every 30 s
    (FAST): what reaches a warm watch sooner is a KILL or the baton passing on."""
    monkeypatch.setattr(mw, "FAST", 30.0)
    monkeypatch.setattr(mw, "WARM", 60.0)
    monkeypatch.setattr(mw, "LONG", 30.0)
    monkeypatch.setattr(mw, "WAIT", 30.0)
    monkeypatch.setattr(mb, "THROTTLE", 0.1)


async def test_warm_watches_are_woken_by_another_processs_ring(
    make_queue: Callable[..., JobQueue], long_warm: None, db_url: str, prefix: str
) -> None:
    """Right after a ring every watch is warm (a burst): one of them holds the baton and
    sleeps on the server under the cold lock, the others wait for the baton. A ring from
    another process then reaches the holder by its KILL and the waiters by the baton it
    lets go of: all of them wake at once, not at their next warm look 30 s later (completion
    -> next start across processes, where every watch is warm)."""
    q = make_queue()
    async with q:
        ws = [Watching(q), Watching(q)]
        try:
            await asyncio.sleep(1.0)  # settled: one holder asleep, cold
            t0 = time.time()
            await q.enqueue("t", {})  # every watch sees it and is warm from now on
            await asyncio.sleep(PROMPT)
            assert max(w.first_after(t0) - t0 for w in ws) < PROMPT
            await asyncio.sleep(0.5)  # the baton taken again, while warm
            holders = [w.watch.thread for w in ws if w.watch.holding]
            cold = await _cold_holder(q)
            done, _err = await _produce(db_url, prefix, 2, 0.6)
            await asyncio.sleep(PROMPT)
        finally:
            for w in ws:
                await w.stop()
    late = [w.first_after(t) - t for w in ws for t in done]
    assert max(late) < PROMPT, late
    assert len(holders) == 1 and cold == holders[0]


async def test_busy_waiters_wait_for_the_baton_as_when_cold_and_still_wake(
    make_queue: Callable[..., JobQueue], monkeypatch: pytest.MonkeyPatch, db_url: str,
    prefix: str,
) -> None:
    """Warm after a ring, a waiter looks at the bell every FAST seconds, unless its worker is
    busy (Listener.busy: its claims come back full, so it claims again without a wake):
    then it waits for the baton as when cold, and a ring still reaches it at once, by the
    baton the woken holder lets go of."""
    monkeypatch.setattr(mw, "WARM", 60.0)
    monkeypatch.setattr(mw, "LONG", 30.0)
    monkeypatch.setattr(mw, "WAIT", 30.0)
    busy = [False]
    q = make_queue()
    async with q:
        ws = [Watching(q) for _ in range(3)]
        for w in ws:
            w.watch.set_busy(lambda: busy[0])
        try:
            await asyncio.sleep(1.0)  # settled
            await q.enqueue("t", {})  # warm from now on
            await asyncio.sleep(0.3)

            async def waiter_looks() -> int:
                before = {id(w): w.watch.looks for w in ws}
                await asyncio.sleep(0.5)
                return sum(w.watch.looks - before[id(w)] for w in ws if not w.watch.holding)

            assert await waiter_looks() > 10  # idle and warm: every FAST seconds
            busy[0] = True
            await asyncio.sleep(0.1)  # (a look under way ends)
            assert await waiter_looks() <= 2  # busy: waiting for the baton
            done, _err = await _produce(db_url, prefix, 1, 0.1)
            await asyncio.sleep(PROMPT)
        finally:
            for w in ws:
                await w.stop()
    late = [w.first_after(done[0]) - done[0] for w in ws]
    assert max(late) < PROMPT, late

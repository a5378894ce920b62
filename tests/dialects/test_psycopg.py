"""psycopg 3 (``postgresql+psycopg://``) as the queue's driver, directly and through PgBouncer
in transaction mode (tests/pgbouncer.py).

The semantics, enqueue and scheduling suites run on it through PgBouncer (their
``pgbouncer-psycopg`` parameter, tests/conftest.py); here: the pooler found and nothing
prepared by name, a caching engine refused, one round trip per statement on the wire (what
makes it the driver for a pooler: asyncpg, with no statement cache, needs two), and LISTEN on
a psycopg connection (the queue's own, and a ``listen_url``).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from conftest import PG_URL, drop_tables
from pgbouncer import PgBouncer
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool
from wakekit import QUICK, wake_time

from aiojobqueue import JobContext, JobQueue
from aiojobqueue.dialects.urls import connect_kwargs_for
from aiojobqueue.errors import ConfigurationError

PSYCOPG_URL = PG_URL.replace("+asyncpg", "+psycopg")


def psycopg(url: str) -> str:
    return url.replace("+asyncpg", "+psycopg")


@pytest_asyncio.fixture
async def tables(pgbouncer: PgBouncer) -> AsyncIterator[str]:
    """A fresh table prefix, its tables dropped afterwards (directly)."""
    prefix = f"t{uuid.uuid4().hex[:10]}_"
    yield prefix
    await drop_tables(PG_URL, prefix)


class WireCount:
    """A TCP relay in front of PgBouncer counting the client's protocol messages by type:
    ``P`` Parse, ``B`` Bind, ``H`` Flush, ``S`` Sync, ``Q`` simple Query. The client waits
    for the server after each Flush, Sync or Query, so their sum is its round trips."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.kinds: Counter[str] = Counter()
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _accept(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        sr, sw = await asyncio.open_connection("127.0.0.1", self.target)
        for t in (self._up(cr, sw), self._pipe(sr, cw)):
            task = asyncio.create_task(t)
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        finally:
            w.close()

    async def _up(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:  # untyped: SSL / GSS encryption requests, then the startup packet
                n = int.from_bytes(await r.readexactly(4), "big")
                body = await r.readexactly(n - 4)
                w.write(n.to_bytes(4, "big") + body)
                await w.drain()
                if int.from_bytes(body[:4], "big") not in (80877103, 80877104):
                    break
            while True:
                head = await r.readexactly(5)
                body = await r.readexactly(int.from_bytes(head[1:], "big") - 4)
                self.kinds[head[:1].decode()] += 1
                w.write(head + body)
                if head[:1] in b"HSQX":  # the client waits (or leaves) after these
                    await w.drain()
        except asyncio.IncompleteReadError:
            pass
        finally:
            w.close()


async def _drain(url: str, prefix: str, n: int) -> None:
    q = JobQueue(url, prefix=prefix, **QUICK)

    @q.handler("w")
    async def w(ctx: JobContext, i: int) -> int:
        return i

    async with q:
        async with q.batch() as b:
            for i in range(n):
                b.add("w", {"i": i})
        await q.run_until_idle()


@pytest.mark.timeout(60)
async def test_one_round_trip_per_statement_through_the_pooler(
    pgbouncer: PgBouncer, tables: str,
) -> None:
    """Through PgBouncer with no statement kept prepared, psycopg sends every statement as
    Parse/Bind/Execute/Sync: one round trip (the one Flush is the executemany of the
    schema's meta rows, pipelined: several statements in it); asyncpg, on the same queue
    work, waits for a Describe first: a Flush per statement, two round trips (and it parses
    each statement twice). Statements without parameters (BEGIN, COMMIT, DDL) go as a simple
    Query on both: one round trip."""
    counts: dict[str, Counter[str]] = {}
    for driver, url in (("asyncpg", pgbouncer.url), ("psycopg", psycopg(pgbouncer.url))):
        wire = WireCount(pgbouncer.port)
        port = await wire.start()
        try:
            await _drain(make_url(url).set(port=port).render_as_string(hide_password=False),
                         f"{tables}{driver[0]}", 40)
        finally:
            await wire.close()
        await drop_tables(PG_URL, f"{tables}{driver[0]}")
        counts[driver] = wire.kinds
    apg, psy = counts["asyncpg"], counts["psycopg"]
    assert psy["B"] > 20 and psy["H"] <= 1 and psy["H"] + psy["S"] <= psy["B"], psy
    assert apg["B"] > 20 and apg["H"] >= apg["B"] - 2, apg  # a Describe round trip each
    trips = {d: c["H"] + c["S"] + c["Q"] for d, c in counts.items()}
    per = {d: trips[d] / (c["B"] + c["Q"]) for d, c in counts.items()}
    assert per["psycopg"] <= 1.0 and per["asyncpg"] > 1.5, (per, counts)


async def test_psycopg_behind_the_pooler_prepares_nothing_by_name(
    pgbouncer: PgBouncer, tables: str,
) -> None:
    assert await connect_kwargs_for(make_url(PSYCOPG_URL)) == {}
    assert (await connect_kwargs_for(make_url(psycopg(pgbouncer.url)))
            == {"prepare_threshold": None})
    for url, threshold in ((PSYCOPG_URL, 5), (psycopg(pgbouncer.url), None)):
        async with JobQueue(url, prefix=tables, **QUICK) as q, q.engine.connect() as conn:
            raw = await conn.get_raw_connection()
            driver: Any = raw.driver_connection
            assert driver.prepare_threshold == threshold


async def test_a_preparing_psycopg_engine_behind_the_pooler_is_refused(
    pgbouncer: PgBouncer, tables: str,
) -> None:
    engine = create_async_engine(psycopg(pgbouncer.url), poolclass=NullPool)
    try:
        with pytest.raises(ConfigurationError, match="prepare_threshold"):
            async with JobQueue(engine, prefix=tables):
                pass
    finally:
        await engine.dispose()
    good = create_async_engine(psycopg(pgbouncer.url),
                               connect_args={"prepare_threshold": None})
    try:
        async with JobQueue(good, prefix=tables) as q:
            assert await q.enqueue("nobody") > 0
    finally:
        await good.dispose()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["direct", "listen_url"])
async def test_psycopg_listen_wakes_an_idle_worker(
    pgbouncer: PgBouncer, tables: str, caplog: pytest.LogCaptureFixture, how: str,
) -> None:
    """LISTEN on psycopg: on the queue's own connection (direct), and on a psycopg
    ``listen_url`` beside a queue that goes through PgBouncer."""
    caplog.set_level(logging.WARNING, "aiojobqueue")
    if how == "direct":
        took = await wake_time(PSYCOPG_URL, tables)
    else:
        took = await wake_time(psycopg(pgbouncer.url), tables, listen_url=PSYCOPG_URL)
    assert took < 2.0, took
    assert not [r for r in caplog.records if "do not arrive" in r.getMessage()]


@pytest.mark.timeout(60)
async def test_psycopg_through_the_pooler_alone_warns_once_and_polls(
    pgbouncer: PgBouncer, tables: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "aiojobqueue")
    assert await wake_time(psycopg(pgbouncer.url), tables) == float("inf")
    warned = [r for r in caplog.records if "do not arrive" in r.getMessage()]
    assert len(warned) == 1 and "listen_url" in warned[0].getMessage()

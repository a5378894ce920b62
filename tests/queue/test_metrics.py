"""``aiojobqueue.metrics`` on every database: counters and histograms from real attempts, the
database gauges read from a scrape thread through the queue's loop (and from the loop
itself), the HTTP endpoint, and the gauge queries' plans next to many finished rows."""

from __future__ import annotations

import asyncio
import socket
import urllib.request
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from conftest import eventually
from finalizekit import serving
from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy import event

from aiojobqueue import JobContext, JobQueue
from aiojobqueue.metrics import GAUGE_STATES, gauge_queries, register, serve_metrics
from bench.metrics_plans import fill, plans


def value(reg: CollectorRegistry, name: str, **labels: str) -> float:
    return reg.get_sample_value(name, labels) or 0.0


async def test_counters_and_run_time_from_attempts(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()
    reg = CollectorRegistry()
    register(q, reg)
    gate = asyncio.Event()

    @q.handler("ok")
    async def ok(ctx: JobContext) -> None:
        await asyncio.sleep(0.05)

    @q.handler("bad", max_attempts=2)
    async def bad(ctx: JobContext) -> None:
        raise ValueError("no")

    @q.handler("stuck")
    async def stuck(ctx: JobContext) -> None:
        gate.set()
        await asyncio.sleep(60)

    async with q, serving(q):
        ids = [await q.enqueue("ok", group="a") for _ in range(3)]
        failing = await q.enqueue("bad", group="b")
        victim = await q.enqueue("stuck")
        for i in ids:
            await q.wait(i, timeout=15)
        await asyncio.wait_for(gate.wait(), 15)
        await q.cancel(victim)

        async def ended() -> bool:
            return (value(reg, "aiojobqueue_jobs_finished_total", type="stuck",
                          group="default", outcome="cancelled") == 1
                    and (await q.get(failing)).state == "failed")

        await eventually(ended, timeout=15)
    assert value(reg, "aiojobqueue_jobs_finished_total", type="ok", group="a",
                 outcome="done") == 3
    assert value(reg, "aiojobqueue_jobs_finished_total", type="bad", group="b",
                 outcome="failed") == 1
    assert value(reg, "aiojobqueue_job_retries_total", type="bad", group="b") == 1
    assert value(reg, "aiojobqueue_job_run_seconds_count", type="ok") == 3
    assert value(reg, "aiojobqueue_job_run_seconds_sum", type="ok") >= 0.15
    assert value(reg, "aiojobqueue_job_run_seconds_count", type="bad") == 2


async def test_wait_counts_from_ready_to_start(make_queue: Callable[..., JobQueue]) -> None:
    """One slot: ``queued`` waits for ``blocker`` to finish (~1 s); ``after``, which depends
    on the blocker, was ready only once it finished: its wait does not include the run
    (about 0.3 s, waiting for the one slot; counted from its enqueue it would be 1.3 s)."""
    q = make_queue(capacity=1)
    reg = CollectorRegistry()
    register(q, reg)

    @q.handler("blocker")
    async def blocker(ctx: JobContext) -> None:
        await asyncio.sleep(1.0)

    @q.handler("queued")
    async def queued(ctx: JobContext) -> None:
        await asyncio.sleep(0.3)

    @q.handler("after")
    async def after(ctx: JobContext) -> None:
        return None

    async with q:
        first = await q.enqueue("blocker", priority=10)
        await q.enqueue("queued")
        await q.enqueue("after", depends_on=[first])
        async with serving(q):
            await eventually(lambda: all(
                value(reg, "aiojobqueue_job_wait_seconds_count", type=t) == 1
                for t in ("blocker", "queued", "after")), timeout=20)
    queued_wait = value(reg, "aiojobqueue_job_wait_seconds_sum", type="queued")
    after_wait = value(reg, "aiojobqueue_job_wait_seconds_sum", type="after")
    assert queued_wait >= 0.9, queued_wait
    # ready when the blocker finished; then it waits for the one slot (queued, 0.3 s) at
    # most, with room for a loaded machine's rounds
    assert after_wait < 0.9, after_wait


def scrape(reg: CollectorRegistry) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    for family in reg.collect():
        for s in family.samples:
            if s.name in ("aiojobqueue_jobs", "aiojobqueue_workers"):
                out[(s.name, *(s.labels[k] for k in sorted(s.labels)))] = s.value
    return out


async def test_gauges_are_read_from_a_scrape_thread(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()
    reg = CollectorRegistry()
    gate = asyncio.Event()

    @q.handler("t")
    async def t(ctx: JobContext) -> None:
        gate.set()
        await asyncio.sleep(60)

    async with q:
        metrics = register(q, reg, cache_seconds=0.3)
        await q.enqueue("nobody", group="a")
        await q.enqueue("nobody", group="b")
        await q.enqueue("nobody", group="b")
        await q.enqueue("t", run_after=timedelta(hours=1))
        running = await q.enqueue("t", group="c")
        await q.enqueue("nobody", group="d", depends_on=[running])  # waiting
        async with q.batch() as b:  # a container's children wait for it to start
            box = b.container("box", group="d", depends_on=[running])
            b.add("nobody", parent=box)
            b.add("nobody", parent=box)
        reads: list[str] = []
        # the gauges' own statements (the worker's census counts by group too)
        gauge_sql = {str(stmt.compile(dialect=q.engine.dialect))
                     for _, stmt in gauge_queries(q._t)}

        def spy(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if statement in gauge_sql:
                reads.append(statement)

        event.listen(q.engine.sync_engine, "before_cursor_execute", spy)
        async with serving(q):
            await asyncio.wait_for(gate.wait(), 15)
            expect = {
                ("aiojobqueue_jobs", "a", "ready"): 1.0,
                ("aiojobqueue_jobs", "b", "ready"): 2.0,
                ("aiojobqueue_jobs", "c", "running"): 1.0,
                ("aiojobqueue_jobs", "default", "scheduled"): 1.0,
                ("aiojobqueue_jobs", "d", "waiting"): 4.0,  # the container counts too
                ("aiojobqueue_workers",): 1.0,
            }

            async def scraped() -> bool:
                return await asyncio.to_thread(scrape, reg) == expect

            await eventually(scraped, timeout=15)
            # cached: scrapes within cache_seconds read the database once
            await asyncio.sleep(0.35)
            before = len(reads)
            for _ in range(3):
                await asyncio.to_thread(scrape, reg)
            assert len(reads) - before == len(GAUGE_STATES)  # one read: a statement per state
            text = (await asyncio.to_thread(generate_latest, reg)).decode()
            assert 'aiojobqueue_jobs{group="b",state="ready"} 2.0' in text
            # from the loop's own thread: no wait on itself; the counts it schedules land
            await q.cancel(running)
            await eventually(lambda: ("aiojobqueue_jobs", "c", "running") not in scrape(reg),
                             timeout=15)
        event.remove(q.engine.sync_engine, "before_cursor_execute", spy)
        assert metrics.gauges()[1] in (0, 1)


async def test_serve_metrics_answers_http(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with q:
        await q.enqueue("nobody")
        server, _ = serve_metrics(q, port, addr="127.0.0.1", registry=CollectorRegistry())
        try:
            def get() -> str:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                    return str(r.read().decode())

            body = await asyncio.to_thread(get)
        finally:
            server.shutdown()
            server.server_close()
    assert 'aiojobqueue_jobs{group="default",state="ready"} 1.0' in body
    assert "# TYPE aiojobqueue_jobs_finished_total counter" in body
    assert "# TYPE aiojobqueue_job_wait_seconds histogram" in body


async def test_gauge_queries_stay_on_the_state_indexes(
    make_queue: Callable[..., JobQueue],
) -> None:
    """Next to many finished jobs (50,000 here; bench/metrics_plans.py shows 1,000,000) each
    gauge query reads one index range: no scan of the table."""
    q = make_queue()
    async with q:
        await fill(q, 50_000)
        async with q.engine.connect() as conn:
            name = conn.dialect.name
            got = await plans(q, conn)
    table = q._t.jobs.name
    for state, lines in got.items():
        plan = "\n".join(lines)
        if name == "postgresql":
            assert "Seq Scan" not in plan and f"{q.prefix}ix_" in plan, (state, plan)
        elif name == "mysql":
            assert "type=ALL" not in plan and "key=None" not in plan, (state, plan)
        else:
            on_table = [x for x in lines if table in x]
            assert on_table and all("INDEX" in x for x in on_table), (state, plan)

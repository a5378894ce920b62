"""OpenTelemetry tracing (aiojobqueue.tracing), on every database, through the public API.

The enqueuer is this process, with the SDK's InMemorySpanExporter; the consumer is a second
process (tests/otelworker.py) with its own provider, which reads the trace context from the
database and writes its finished spans to a file read here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from aiojobqueue import JobContext, JobQueue
from aiojobqueue.dialects.mysql import TokenInsert

otel = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF  # noqa: E402
from opentelemetry.util._once import Once  # noqa: E402

WORKER = Path(__file__).resolve().parents[1] / "otelworker.py"


def _set_provider(provider: TracerProvider | None) -> None:
    """Set (or clear) the global tracer provider: the API sets it once per process, so the
    test resets its guard (as OpenTelemetry's own test utilities do)."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
    if provider is not None:
        trace.set_tracer_provider(provider)


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """The SDK on in this process, its spans kept in memory; off again afterwards."""
    exp = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exp))
    _set_provider(provider)
    try:
        yield exp
    finally:
        _set_provider(None)


@pytest.fixture
def no_tracer() -> Iterator[None]:
    _set_provider(None)
    yield


def _hex(ctx: Any) -> tuple[str, str]:
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def _ids(traceparent: str) -> tuple[str, str]:
    """(trace id, span id) of a W3C traceparent (its flags vary with the SDK)."""
    version, trace_id, span_id, _flags = traceparent.split("-")
    assert version == "00"
    return trace_id, span_id


async def _traces(q: JobQueue) -> dict[int, Any]:
    J = q._t.jobs
    async with q.engine.connect() as conn:
        return dict((await conn.execute(select(J.c.id, J.c.trace))).all())


def _run_worker(url: str, prefix: str, out: Path) -> list[dict[str, Any]]:
    p = subprocess.run([sys.executable, str(WORKER), url, prefix, str(out)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return [json.loads(line) for line in out.read_text().splitlines()]


async def test_spans_cross_processes_through_the_database(
    make_queue: Callable[..., JobQueue], exporter: InMemorySpanExporter, db_url: str,
    prefix: str, tmp_path: Path,
) -> None:
    """Producer spans here; consumer spans in the worker process are their children (the
    context read from the jobs' rows), a retry links to its first attempt, a DAG's jobs
    and what a handler enqueues are all in the enqueuer's trace."""
    q = make_queue()
    tracer = trace.get_tracer("test")
    async with q:
        with tracer.start_as_current_span("request") as request:
            a = await q.enqueue("ok", {"n": 1})
            a2 = await q.enqueue("ok", {"n": 2})  # a known group: the lone insert path
            keyed = await q.enqueue("ok", {"n": 3}, key="k1")  # the transaction path
            async with q.batch() as b:
                box = b.container("box")
                x = b.add("flaky", {"n": 4}, parent=box)
                y = b.add("ok", {"n": 5}, parent=box, depends_on=[x])
                after = b.add("ok", {"n": 6}, depends_on=[box])
                plain = [b.add("ok", {"n": 10 + i}) for i in range(3)]
            sp = await q.enqueue("spawn")
        stored = await _traces(q)

    produced = {s.name: s for s in exporter.get_finished_spans()}
    req_trace, req_span = _hex(request.get_span_context())
    enq = [s for s in exporter.get_finished_spans() if s.name == "aiojobqueue.enqueue ok"]
    assert len(enq) == 3
    batch = produced["aiojobqueue.batch"]
    for s in [*enq, batch, produced["aiojobqueue.enqueue spawn"]]:
        assert s.kind == trace.SpanKind.PRODUCER
        assert s.parent is not None and f"{s.parent.span_id:016x}" == req_span
        assert _hex(s.get_span_context())[0] == req_trace
    by_id = {s.attributes["aiojobqueue.job.id"]: s for s in enq if s.attributes}
    assert set(by_id) == {a, a2, keyed}
    assert by_id[a].attributes is not None and by_id[a].attributes["aiojobqueue.job.type"] == "ok"
    # the W3C context of the producer span is stored with each job
    batch_ids = [box.id, x.id, y.id, after.id, *(r.id for r in plain)]
    for jid in (a, a2, keyed):
        assert _ids(stored[jid]["traceparent"]) == _hex(by_id[jid].get_span_context())
    batch_span = _hex(batch.get_span_context())[1]
    for jid in batch_ids:
        assert _ids(stored[jid]["traceparent"]) == (req_trace, batch_span)

    spans = _run_worker(db_url, prefix, tmp_path / "spans.jsonl")
    runs = [s for s in spans if s["name"].startswith("aiojobqueue.run ")]
    for s in runs:
        assert s["kind"] == "CONSUMER" and s["trace_id"] == req_trace, s
    by_job: dict[int, list[dict[str, Any]]] = {}
    for s in runs:
        by_job.setdefault(s["attributes"]["aiojobqueue.job.id"], []).append(s)

    (ra,) = by_job[a]
    assert ra["name"] == "aiojobqueue.run ok"
    assert ra["parent"] == _hex(by_id[a].get_span_context())[1]
    assert ra["attributes"] == {
        "aiojobqueue.job.id": a,
        "aiojobqueue.job.type": "ok", "aiojobqueue.job.group": "default",
        "aiojobqueue.job.attempt": 1, "aiojobqueue.outcome": "done"}
    for jid in (a2, keyed):
        assert by_job[jid][0]["parent"] == _hex(by_id[jid].get_span_context())[1]
    # the DAG: every job that runs is a child of the batch's span
    for jid in (x.id, y.id, after.id, *(r.id for r in plain)):
        assert {s["parent"] for s in by_job[jid]} == {batch_span}, by_job[jid]
    assert box.id not in by_job  # a container never runs

    # the retry: attempt 1 failed (error, status), attempt 2 links to it
    first, second = sorted(by_job[x.id], key=lambda s: s["attributes"]["aiojobqueue.job.attempt"])
    assert first["attributes"]["aiojobqueue.outcome"] == "failed"
    assert first["attributes"]["aiojobqueue.error.type"] == "ValueError"
    assert first["attributes"]["aiojobqueue.error.message"] == f"first attempt of {x.id}"
    assert first["status"] == "ERROR" and first["links"] == []
    assert second["attributes"]["aiojobqueue.job.attempt"] == 2
    assert second["attributes"]["aiojobqueue.outcome"] == "done"
    assert second["links"] == [[req_trace, first["span_id"]]]

    # a job enqueued by a handler: its producer span is the handler's consumer span's
    # child, and its own run that producer's child, all in the one trace
    (rsp,) = by_job[sp]
    (inner,) = [s for s in spans if s["name"] == "aiojobqueue.enqueue ok"]
    assert inner["parent"] == rsp["span_id"] and inner["trace_id"] == req_trace
    (child,) = by_job[inner["attributes"]["aiojobqueue.job.id"]]
    assert child["parent"] == inner["span_id"]


async def test_no_tracer_leaves_the_column_null(
    make_queue: Callable[..., JobQueue], no_tracer: None,
) -> None:
    """With no tracer provider set (the API alone), enqueue, batch, a retry and a handler's
    enqueue write NULL to ``trace`` and nothing records."""
    q = make_queue()

    @q.handler("flaky", max_attempts=2)
    async def flaky(ctx: JobContext) -> None:
        if ctx.attempt == 1:
            raise ValueError("once")
        await ctx.enqueue("ok", {})

    @q.handler("ok")
    async def ok(ctx: JobContext) -> None:
        assert not trace.get_current_span().is_recording()

    async with q:
        await q.enqueue("flaky")
        await q.enqueue("ok")
        async with q.batch() as b:
            u = b.add("ok")
            b.add("ok", depends_on=[u])
        await q.run_until_idle()
        stored = await _traces(q)
        assert len(stored) == 5 and set(stored.values()) == {None}


async def test_sampled_out_leaves_the_column_null(make_queue: Callable[..., JobQueue]) -> None:
    """A provider whose spans are not recording (sampled out) stores nothing either."""
    exp = InMemorySpanExporter()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(SimpleSpanProcessor(exp))
    _set_provider(provider)
    try:
        q = make_queue()

        @q.handler("flaky", max_attempts=2)
        async def flaky(ctx: JobContext) -> None:
            if ctx.attempt == 1:
                raise ValueError("once")

        async with q:
            await q.enqueue("flaky")
            async with q.batch() as b:
                b.add("flaky")
            await q.run_until_idle()
            stored = await _traces(q)
        assert len(stored) == 2 and set(stored.values()) == {None}
        assert exp.get_finished_spans() == ()
    finally:
        _set_provider(None)


async def test_a_retry_in_the_same_process_links_to_its_first_attempt(
    make_queue: Callable[..., JobQueue], exporter: InMemorySpanExporter,
) -> None:
    """Jobs enqueued without tracing and run with it: each attempt is a root span, and
    every later attempt links to the first (kept in the column by the failure)."""
    _set_provider(None)
    q = make_queue()
    attempts: list[int] = []

    @q.handler("flaky", max_attempts=3)
    async def flaky(ctx: JobContext) -> None:
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise ValueError("again")

    async with q:
        jid = await q.enqueue("flaky")
        assert (await _traces(q))[jid] is None
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        _set_provider(provider)
        await q.run_until_idle()
        stored = (await _traces(q))[jid]
    assert attempts == [1, 2, 3]
    spans = sorted(exporter.get_finished_spans(),
                   key=lambda s: (s.attributes or {})["aiojobqueue.job.attempt"])
    assert [s.parent for s in spans] == [None, None, None]
    first = spans[0].get_span_context()
    assert set(stored) == {"first"} and _ids(stored["first"]) == _hex(first)
    for s in spans[1:]:
        assert [lk.context.span_id for lk in s.links] == [first.span_id]
    assert [(s.attributes or {})["aiojobqueue.outcome"] for s in spans] == [
        "failed", "failed", "done"]


async def test_the_executemany_insert_paths_store_the_context(
    make_queue: Callable[..., JobQueue], exporter: InMemorySpanExporter,
) -> None:
    """MySQL 8's insert (executemany, ids read back by a token), on any database, and its
    rows of the rare shape (an absolute run_after) carry the context as the bulk paths do."""
    q = make_queue()
    async with q:
        assert q._inserter is not None and q._core is not None
        q._inserter.path = TokenInsert(q._core.db.ops)
        async with q.batch() as b:
            refs = [b.add("t", {"i": i}) for i in range(3)]
            later = b.add("t", run_after=datetime.now(UTC) + timedelta(hours=1))
        stored = await _traces(q)
    (span,) = exporter.get_finished_spans()
    for r in [*refs, later]:
        assert _ids(stored[r.id]["traceparent"]) == _hex(span.get_span_context())

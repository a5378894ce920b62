"""A worker process with the OpenTelemetry SDK on, for tests/test_tracing.py.

    python tests/otelworker.py URL PREFIX SPANS

Configures a tracer provider exporting to the SDK's InMemorySpanExporter, runs the queue
until it is idle, then writes every finished span to SPANS as one JSON object a line
(name, kind, ids in hex, parent, links, attributes, status). Handlers: ``ok`` returns its
``n``; ``flaky`` fails its first attempt; ``spawn`` enqueues an ``ok`` job from inside.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from aiojobqueue import JobContext, JobQueue


def as_dict(s: ReadableSpan) -> dict[str, Any]:
    ctx = s.get_span_context()
    assert ctx is not None
    return {
        "name": s.name,
        "kind": s.kind.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent": None if s.parent is None else f"{s.parent.span_id:016x}",
        "parent_trace": None if s.parent is None else f"{s.parent.trace_id:032x}",
        "links": [[f"{lk.context.trace_id:032x}", f"{lk.context.span_id:016x}"]
                  for lk in s.links],
        "attributes": dict(s.attributes or {}),
        "status": s.status.status_code.name,
    }


async def main(url: str, prefix: str, out: str) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    q = JobQueue(url, prefix=prefix, poll_interval=0.05, retry_backoff=0.01,
                 retry_backoff_max=0.05)

    @q.handler("ok")
    async def ok(ctx: JobContext, n: int = 0) -> int:
        return n

    @q.handler("flaky", max_attempts=3)
    async def flaky(ctx: JobContext, n: int = 0) -> int:
        if ctx.attempt == 1:
            raise ValueError(f"first attempt of {ctx.job_id}")
        return n

    @q.handler("spawn")
    async def spawn(ctx: JobContext) -> int:
        return await ctx.enqueue("ok", {"n": 99})

    async with q:
        await q.run_until_idle()
    provider.force_flush()
    with open(out, "w") as f:  # noqa: ASYNC230 - once, at the end
        for s in exporter.get_finished_spans():
            f.write(json.dumps(as_dict(s)) + "\n")


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))

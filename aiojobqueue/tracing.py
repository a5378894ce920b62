"""OpenTelemetry tracing (``pip install "aiojobqueue[otel]"``): nothing to call.

With a tracer provider configured (``opentelemetry.trace.set_tracer_provider``):

* ``enqueue()`` and a ``batch()`` make a PRODUCER span (``aiojobqueue.enqueue <type>`` /
  ``aiojobqueue.batch``), a child of whatever span is current, and store its W3C trace
  context (the global propagator's output: ``traceparent``, ``tracestate``) with every job
  they insert, in the jobs' ``trace`` column. A batch's jobs, a DAG's included, all carry the
  same context, so they are all in the enqueuer's trace.
* Each attempt is a CONSUMER span ``aiojobqueue.run <type>`` whose parent is read back from
  that column: in whichever process runs it, however much later. It is current while the
  handler runs, so what the handler enqueues (and any instrumented library it calls) joins
  the same trace. When an attempt fails, its span's context is kept in the column
  (``"first"``, once) and every later attempt's span links to it.
* Attributes: ``aiojobqueue.job.id``, ``.job.type``, ``.job.group``, ``.job.attempt``,
  ``aiojobqueue.outcome`` (done | failed | cancelled | released, or lost: the lease was
  taken from it and nothing was written), and on a failure
  ``aiojobqueue.error.type`` / ``.error.message`` with the span's status set to ERROR.

Without OpenTelemetry installed, with no tracer provider set (the API's default proxy) or
with one whose spans are not recording (sampled out), an enqueue writes NULL to the column
as before and an attempt makes no span: the only work is ``tracer()``'s look at the global
provider, once per enqueue call and per attempt.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .batch import _Spec
    from .claimed import Claimed
    from .finalize import Outcome

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import (
        Link,
        NoOpTracerProvider,
        ProxyTracerProvider,
        SpanKind,
        Status,
        StatusCode,
    )
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the otel extra is not installed: every hook returns at once
    trace = None  # type: ignore[assignment]

T = TypeVar("T")

#: The instrumentation scope's name.
NAME = "aiojobqueue"
_W3C: Any = TraceContextTextMapPropagator() if trace is not None else None
# (the provider the cached tracer came from, the tracer): get_tracer() builds a new Tracer
# on every call on the SDK, so one is kept per provider
_cached: tuple[Any, Any] = (None, None)
_UNKNOWN = object()
#: A tracer provider named by environment variable (the API loads it on first use).
_FROM_ENV = trace is not None and "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
#: Parent contexts by stored carrier: a batch's jobs share one, and parsing it is a fifth
#: of an attempt's span cost. Cleared when full.
_parents: dict[Any, Any] = {}
PARENTS = 1024


def tracer() -> Any:
    """The aiojobqueue tracer of the global provider, or None where nothing would record:
    OpenTelemetry not installed, or no provider set (the API's proxy or no-op)."""
    global _cached
    if trace is None:
        return None
    # The API's global, read directly: get_tracer_provider() looks in os.environ on every
    # call while none is set (1-2 us, per enqueue and per attempt, a few per cent of a
    # job); it is only needed where a provider is named by environment variable.
    provider: Any = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is None and not _FROM_ENV:
        return None
    if provider is None or provider is _UNKNOWN:
        provider = trace.get_tracer_provider()
    if provider is _cached[0]:
        return _cached[1]
    if isinstance(provider, (ProxyTracerProvider, NoOpTracerProvider)):
        return None
    from . import __version__

    _cached = (provider, provider.get_tracer(NAME, __version__))
    return _cached[1]


async def traced_insert(specs: Sequence[_Spec], insert: Callable[[], Awaitable[list[int]]]
                        ) -> list[int]:
    """Run ``insert`` (the insert of ``specs``) inside a PRODUCER span, the span's trace
    context stored with each spec; without a recording tracer, just ``insert()``."""
    tr = tracer()
    if tr is None:
        return await insert()
    one = len(specs) == 1
    name = f"aiojobqueue.enqueue {specs[0].type}" if one else "aiojobqueue.batch"
    with tr.start_as_current_span(name, kind=SpanKind.PRODUCER) as span:
        if not span.is_recording():
            return await insert()
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        if carrier:
            text = json.dumps(carrier)
            for s in specs:
                s.trace = text
        span.set_attribute("messaging.batch.message_count", len(specs))
        if one:
            span.set_attribute("aiojobqueue.job.type", specs[0].type)
            span.set_attribute("aiojobqueue.job.group", specs[0].group)
        ids = await insert()
        if one:
            span.set_attribute("aiojobqueue.job.id", ids[0])
        return ids


async def traced_attempt(c: Claimed, run: Callable[[], Awaitable[Outcome | None]]
                         ) -> Outcome | None:
    """Run ``run`` (the attempt ``c``) inside its CONSUMER span, current while it runs;
    without a recording tracer, just ``run()``. A failure's outcome carries the trace
    value to store (``Outcome.trace``) when this is the first traced attempt to fail."""
    tr = tracer()
    if tr is None:
        return await run()
    stored = c.trace if isinstance(c.trace, dict) else {}
    parent = _parent(stored) if stored else None
    links = []
    if "first" in stored:
        first = _span_context(stored["first"])
        if first is not None:
            links.append(Link(first, {"aiojobqueue.link": "first attempt"}))
    span = tr.start_span(
        f"aiojobqueue.run {c.type}", context=parent, kind=SpanKind.CONSUMER, links=links,
        attributes={
            "aiojobqueue.job.id": c.id, "aiojobqueue.job.type": c.type,
            "aiojobqueue.job.group": c.group, "aiojobqueue.job.attempt": c.attempt,
        })
    if not span.is_recording():
        span.end()
        return await run()
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        outcome = await run()
    except BaseException as exc:  # the worker's own cancellation (not an outcome)
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
        raise
    else:
        kind = outcome.kind if outcome is not None else "lost"
        span.set_attribute("aiojobqueue.outcome", kind)
        if outcome is not None and kind == "failed":
            err = outcome.error or {}
            span.set_attribute("aiojobqueue.error.type", str(err.get("type")))
            span.set_attribute("aiojobqueue.error.message", str(err.get("message"))[:1000])
            span.set_status(Status(StatusCode.ERROR, str(err.get("type"))))
            if "first" not in stored:
                carrier: dict[str, str] = {}
                _W3C.inject(carrier, context=trace.set_span_in_context(span))
                outcome = replace(outcome, trace={**stored, "first": carrier["traceparent"]})
        return outcome
    finally:
        otel_context.detach(token)
        span.end()


def _parent(stored: dict[str, Any]) -> Any:
    """The context ``stored`` (a carrier) names, by the global propagator; cached."""
    try:
        key = (id(propagate.get_global_textmap()), *stored.items())
        ctx = _parents.get(key)
    except TypeError:  # a value that is not hashable: no cache
        return propagate.extract(stored)
    if ctx is None:
        if len(_parents) >= PARENTS:
            _parents.clear()
        ctx = _parents[key] = propagate.extract(stored)
    return ctx


def _span_context(traceparent: Any) -> Any:
    """The SpanContext a stored ``traceparent`` names, or None."""
    if not isinstance(traceparent, str):
        return None
    ctx = trace.get_current_span(_W3C.extract({"traceparent": traceparent})).get_span_context()
    return ctx if ctx.is_valid else None


__all__ = ["NAME", "traced_attempt", "traced_insert", "tracer"]

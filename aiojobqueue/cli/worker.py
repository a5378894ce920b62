"""``aiojobqueue worker MODULE:QUEUE``: import the user's queue and serve it until SIGTERM or
SIGINT, then shut down gracefully (``aiojobqueue.runner``)."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Annotated, Any

import typer

from ..queue import JobQueue
from .app import app
from .runtime import Exit, connect, fail, first_line, normalize_url, run, safe_url

log = logging.getLogger("aiojobqueue")


@app.command()
def worker(
    target: Annotated[str, typer.Argument(
        metavar="MODULE:QUEUE",
        help="Where your JobQueue lives, e.g. myapp.jobs:queue. The current directory is "
        "importable.")],
    url: Annotated[str | None, typer.Option(
        "--url", help="Override the queue's own URL. AIOJOBQUEUE_URL is NOT applied here: "
        "the module configures its queue.")] = None,
    capacity: Annotated[int | None, typer.Option(
        min=1, help="Jobs in flight in this process (overrides the queue's capacity).")] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    log_format: Annotated[str, typer.Option(help="text, or json (one object per line).")] = "text",
    factory: Annotated[bool, typer.Option(
        help="QUEUE is a function that returns the JobQueue: call it.")] = False,
    metrics_port: Annotated[int | None, typer.Option(
        min=0, max=65535, help="Serve Prometheus metrics at http://0.0.0.0:PORT/metrics "
        '(needs pip install "aiojobqueue[prometheus]").')] = None,
) -> None:
    """Run a worker for your queue until SIGTERM/SIGINT, then shut down gracefully."""
    from .. import logs
    from ..runner import run_worker

    serve_metrics = _metrics_server() if metrics_port is not None else None

    if log_level.lower() not in ("debug", "info", "warning", "error"):
        raise typer.BadParameter(f"unknown log level {log_level!r}", param_hint="--log-level")
    if log_format not in ("text", "json"):
        raise typer.BadParameter(f"unknown log format {log_format!r}", param_hint="--log-format")
    q = _queue_of(target, factory, url, capacity)
    logs.configure(log_level, log_format)
    the_url = q._url if isinstance(q._url, str) else str(q._url.url)
    types = sorted(q._handlers)

    async def go() -> None:
        if not types:
            log.warning("%s has no handlers registered: this worker will never run a job",
                        target)
        log.info("worker %s starting: %s on %s (capacity %d, handlers: %s)", q.worker_id,
                 target, safe_url(the_url), q.capacity, ", ".join(types) or "-")
        await connect(q, the_url)
        server = None
        try:
            if serve_metrics is not None and metrics_port is not None:
                try:  # on the queue's loop: the database gauges read through it
                    server, _ = serve_metrics(q, metrics_port)
                except OSError as exc:
                    fail(f"--metrics-port {metrics_port}: {first_line(exc)}", Exit.USAGE)
                log.info("metrics at http://0.0.0.0:%d/metrics", server.server_port)
            await run_worker(q)
        finally:
            if server is not None:
                server.shutdown()
            await q.close()
        log.info("worker %s stopped", q.worker_id)

    run(the_url, go)


def _queue_of(target: str, factory: bool, url: str | None, capacity: int | None) -> JobQueue:
    """The user's JobQueue at ``target``, with ``--url`` and ``--capacity`` applied."""
    q = load_queue(target, factory=factory)
    if url is not None:
        if not isinstance(q._url, str):
            fail("--url: this queue was built from an engine; set its URL in your module "
                 "instead", Exit.USAGE)
        q._url = normalize_url(url)
    if capacity is not None:
        q.capacity = capacity
    return q


def _metrics_server() -> Any:
    """``aiojobqueue.metrics.serve_metrics``; a usage error if the extra is not installed."""
    try:
        from ..metrics import serve_metrics
    except ModuleNotFoundError as exc:
        if exc.name != "prometheus_client":
            raise
        fail('--metrics-port needs prometheus-client: pip install "aiojobqueue[prometheus]"',
             Exit.USAGE)
    return serve_metrics


def load_queue(target: str, *, factory: bool = False) -> JobQueue:
    """The ``JobQueue`` that ``MODULE:ATTR`` names (called first with ``factory``).

    Every way this can go wrong is a one-line usage error (exit 2): a bad target, a module
    that is not there, an import inside it that fails (a missing dependency), an exception
    while it runs, an attribute that is missing or not a queue."""
    mod_name, sep, attr = target.partition(":")
    if not sep or not mod_name or not attr:
        fail(f"expected MODULE:QUEUE, e.g. myapp.jobs:queue, got {target!r}", Exit.USAGE)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module = _import(mod_name)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            fail(f"module {mod_name!r} has no attribute {attr!r}", Exit.USAGE)
        obj = getattr(obj, part)
    if factory:
        if not callable(obj):
            fail(f"{target} is not callable (drop --factory?)", Exit.USAGE)
        try:
            obj = obj()
        except Exception as exc:
            fail(f"{target}() raised {type(exc).__name__}: {first_line(exc)}", Exit.USAGE)
    if not isinstance(obj, JobQueue):
        hint = " (a factory? add --factory)" if callable(obj) else ""
        fail(f"{target} is a {type(obj).__name__}, not a JobQueue{hint}", Exit.USAGE)
    return obj


def _import(mod_name: str) -> Any:
    try:
        return importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        if exc.name and (mod_name == exc.name or mod_name.startswith(exc.name + ".")):
            fail(f"cannot import {mod_name!r}: {exc} (run from the directory that holds it, "
                 "or put it on PYTHONPATH)", Exit.USAGE)
        fail(f"cannot import {mod_name!r}: it imports {exc.name or 'a module'!r}, which is not "
             "installed", Exit.USAGE)
    except Exception as exc:  # the module itself raised: its bug, told in one line
        fail(f"cannot import {mod_name!r}: {type(exc).__name__}: {first_line(exc)} "
             f"(python -c 'import {mod_name}' shows the traceback)", Exit.USAGE)

"""The ``aiojobqueue`` command line (also ``python -m aiojobqueue``).

A thin shell over ``aiojobqueue.admin``: parse, open the queue, call, render. Exit codes:
0 ok, 1 the job or operation failed, 2 usage error (bad option, URL or module),
3 database unreachable or unsupported, 4 schema missing or at another version,
130 interrupted.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from enum import IntEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from . import __version__, admin
from .errors import (
    AioJobQueueError,
    ConfigurationError,
    InvalidJobError,
    InvalidStateError,
    JobNotFoundError,
    SchemaError,
    UnsupportedDatabaseError,
)
from .models import Job
from .queue import JobQueue
from .schema import DEFAULT_PREFIX

T = TypeVar("T")

DEFAULT_URL = "sqlite+aiosqlite:///jobs.db"
DEMO_FILE = "aiojobqueue-demo.db"
CONNECT_TIMEOUT = 15.0


class Exit(IntEnum):
    OK = 0
    FAILED = 1
    USAGE = 2
    UNREACHABLE = 3
    SCHEMA = 4
    INTERRUPTED = 130


out = Console(highlight=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)  # one line per error

app = typer.Typer(
    name="aiojobqueue",
    help="Operate an aiojobqueue database: run workers, inspect, retry, cancel, prune.\n\n"
    "The database comes from --url or AIOJOBQUEUE_URL (default: "
    f"{DEFAULT_URL}). Exit codes: 0 ok, 1 job/operation failed, 2 usage error, "
    "3 database unreachable, 4 schema missing or at another version.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

Url = Annotated[str, typer.Option(
    "--url", envvar="AIOJOBQUEUE_URL", show_envvar=True,
    help="SQLAlchemy URL of the database, e.g. postgresql+asyncpg://user@host/db; "
    "postgresql://, mysql:// and sqlite:/// get their async driver added.")]
Prefix = Annotated[str, typer.Option(
    "--prefix", envvar="AIOJOBQUEUE_PREFIX", show_envvar=True,
    help="Table prefix of the queue.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]


# -- plumbing ---------------------------------------------------------------------------------
class CLIError(Exception):
    def __init__(self, message: str, code: Exit) -> None:
        super().__init__(message)
        self.code = code


def fail(message: str, code: Exit = Exit.FAILED) -> NoReturn:
    raise CLIError(message, code)


def normalize_url(url: str) -> str:
    """Add the async driver to a plain URL (``postgresql://`` -> ``postgresql+asyncpg://``)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        fail(f"bad database URL {url!r}: expected e.g. {DEFAULT_URL}", Exit.USAGE)
    drivers = {"postgresql": "postgresql+asyncpg", "postgres": "postgresql+asyncpg",
               "mysql": "mysql+aiomysql", "mariadb": "mysql+aiomysql",
               "sqlite": "sqlite+aiosqlite"}
    return f"{drivers.get(scheme, scheme)}://{rest}"


def safe_url(url: str) -> str:
    """The URL with its password hidden, for messages."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


def _sqlite_file(url: str) -> Path | None:
    from sqlalchemy.engine import make_url

    u = make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    return Path(u.database)


def explain(exc: BaseException, url: str) -> CLIError:
    """Turn an exception into one line and an exit code; None of them shows a traceback."""
    from sqlalchemy.exc import ArgumentError, DBAPIError, InterfaceError, OperationalError

    where = safe_url(url)
    if isinstance(exc, CLIError):
        return exc
    if isinstance(exc, SchemaError):
        return CLIError(f"{exc} (database: {where})", Exit.SCHEMA)
    if isinstance(exc, UnsupportedDatabaseError):
        return CLIError(str(exc), Exit.UNREACHABLE)
    if isinstance(exc, (JobNotFoundError, InvalidStateError)):
        return CLIError(str(exc), Exit.FAILED)
    if isinstance(exc, (InvalidJobError, ConfigurationError)):
        return CLIError(str(exc), Exit.USAGE)
    if isinstance(exc, AioJobQueueError):
        return CLIError(str(exc), Exit.FAILED)
    if isinstance(exc, ArgumentError):
        return CLIError(f"bad database URL {where!r}: {exc}", Exit.USAGE)
    if isinstance(exc, ModuleNotFoundError) and exc.name in ("asyncpg", "aiomysql", "aiosqlite"):
        extra = {"asyncpg": "postgresql", "aiomysql": "mysql"}.get(exc.name, "")
        hint = f': pip install "aiojobqueue[{extra}]"' if extra else ""
        return CLIError(f"the database driver {exc.name} is not installed{hint}", Exit.USAGE)
    if isinstance(exc, TimeoutError):
        return CLIError(f"cannot reach the database at {where}: timed out", Exit.UNREACHABLE)
    if isinstance(exc, (OperationalError, InterfaceError, OSError)):
        reason = _first_line(getattr(exc, "orig", None) or exc)
        return CLIError(f"cannot reach the database at {where}: {reason}", Exit.UNREACHABLE)
    if isinstance(exc, DBAPIError):
        return CLIError(f"database error: {_first_line(exc.orig or exc)}", Exit.FAILED)
    from sqlalchemy.exc import InvalidRequestError

    if isinstance(exc, InvalidRequestError):
        return CLIError(f"bad database URL {where!r}: {_first_line(exc)}", Exit.USAGE)
    raise exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


def run(url: str, fn: Callable[[], Awaitable[T]]) -> T:
    """Run ``fn`` on a fresh event loop; user errors become one line and an exit code."""
    try:
        return asyncio.run(fn())  # type: ignore[arg-type]
    except KeyboardInterrupt:
        err.print("[yellow]interrupted[/]")
        raise typer.Exit(Exit.INTERRUPTED) from None
    except BaseException as exc:  # every user error gets one line, no traceback
        if isinstance(exc, (typer.Exit, SystemExit)):
            raise
        e = explain(exc, url)
        err.print(f"[bold red]error:[/] {escape(str(e))}")
        raise typer.Exit(e.code) from None


@contextlib.asynccontextmanager
async def opened(url: str, prefix: str, *, migrate: bool = False,
                 must_exist: bool = True, **opts: Any) -> AsyncIterator[JobQueue]:
    """A started queue; without ``migrate`` it creates nothing and wants a current schema."""
    path = _sqlite_file(url)
    if must_exist and path is not None and not path.exists():
        fail(f"no SQLite database at {path} (from {safe_url(url)}): check --url, or create "
             "it with `aiojobqueue migrate`", Exit.UNREACHABLE)
    q = JobQueue(url, prefix=prefix, **opts)
    try:
        await connect(q, url, migrate=migrate)
        yield q
    finally:
        await q.close()


async def connect(q: JobQueue, url: str, *, migrate: bool = True) -> None:
    """Start ``q``; any database error while connecting means "unreachable" (exit 3):
    refused, timed out, bad credentials, no such database."""
    from sqlalchemy.exc import DBAPIError

    try:
        async with asyncio.timeout(CONNECT_TIMEOUT):
            await q.start(migrate=migrate)
    except (DBAPIError, OSError, TimeoutError) as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else _first_line(
            getattr(exc, "orig", None) or exc)
        fail(f"cannot reach the database at {safe_url(url)}: {reason}", Exit.UNREACHABLE)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(admin.to_data(data), indent=2, default=str) + "\n")


def styled(state: str) -> Text:
    from .demo import STATE_STYLE

    return Text(state, style=STATE_STYLE.get(state, ""))


def ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 120:
        return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.1f}s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 172800:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def when(t: datetime | None, now: datetime | None = None) -> str:
    if t is None:
        return "-"
    text = t.strftime("%Y-%m-%d %H:%M:%S")
    if now is not None:
        text += f" ({ago((now - t).total_seconds())} ago)"
    return text


def resolve_url(url: str) -> str:
    return normalize_url(url.strip())


# -- commands ---------------------------------------------------------------------------------
def _version(value: bool) -> None:
    if value:
        out.print(f"aiojobqueue {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="Show the version and exit.")] = False,
) -> None:
    """Operate an aiojobqueue database."""


@app.command()
def demo(
    url: Annotated[str | None, typer.Option(
        "--url", help=f"Database to run on (default: a fresh ./{DEMO_FILE}).")] = None,
    prefix: Prefix = DEFAULT_PREFIX,
    speed: Annotated[float, typer.Option(
        min=0.1, max=50.0, help="Run every job this many times faster.")] = 1.0,
    live: Annotated[bool, typer.Option(help="Show the live view.")] = True,
    as_json: AsJson = False,
) -> None:
    """Run a realistic DAG (two tenants, fan-out/fan-in, a retried job) with a live view."""
    from .demo import containers_line, run_demo, summary_table, verdict

    if url is None:
        path = Path(DEMO_FILE)
        for suffix in ("", "-wal", "-shm"):  # a fresh demo database each time
            Path(str(path) + suffix).unlink(missing_ok=True)
        url = f"sqlite+aiosqlite:///{path}"
    url = resolve_url(url)

    async def go() -> dict[str, Any]:
        console = err if as_json else out
        show = live and not as_json and console.is_terminal
        if not as_json:
            out.print(f"[bold]aiojobqueue demo[/] on [cyan]{escape(safe_url(url))}[/] "
                      f"(prefix {prefix})")
        run_, jobs = await run_demo(url, prefix, speed=speed, live=show, console=console)
        v = verdict(run_, jobs)
        if as_json:
            emit_json(v)
            return v
        out.print(summary_table(run_, jobs))
        out.print(containers_line(run_, jobs))
        f = v["flaky_job"]
        out.print(f"[yellow]↻[/] job #{f['id']} (a globex fetch) failed once with HTTP 503 and "
                  f"was retried: [green]{f['state']}[/] after {f['attempts']} attempts.")
        out.print(f"[green]✓[/] publish (job #{run_.publish_id}) returned "
                  f"{json.dumps(v['publish_job']['result'])}.")
        if not v["ok"]:
            out.print("[bold red]some jobs did not end as expected[/]")
        u = escape(url)
        out.print("\nExplore what it left behind:", soft_wrap=True)
        for line in (f"aiojobqueue status --url {u}",
                     f"aiojobqueue jobs --url {u} --type fetch --limit 5",
                     f"aiojobqueue show {run_.publish_id} --url {u}"):
            out.print("  " + line, soft_wrap=True)
        return v

    v = run(url, go)
    if not v["ok"]:
        raise typer.Exit(Exit.FAILED)


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
) -> None:
    """Run a worker for your queue until SIGTERM/SIGINT, then shut down gracefully."""
    from . import logs
    from .runner import run_worker

    if log_level.lower() not in ("debug", "info", "warning", "error"):
        raise typer.BadParameter(f"unknown log level {log_level!r}", param_hint="--log-level")
    if log_format not in ("text", "json"):
        raise typer.BadParameter(f"unknown log format {log_format!r}", param_hint="--log-format")
    q = load_queue(target, factory=factory)
    if url is not None:
        if not isinstance(q._url, str):
            raise typer.BadParameter("this queue was built from an engine; set its URL in your "
                                     "module instead", param_hint="--url")
        q._url = resolve_url(url)
    if capacity is not None:
        q.capacity = capacity
    logs.configure(log_level, log_format)
    the_url = q._url if isinstance(q._url, str) else str(q._url.url)
    import logging

    log = logging.getLogger("aiojobqueue")

    async def go() -> None:
        if not q._handlers:
            log.warning("%s has no handlers registered: this worker will never run a job",
                        target)
        log.info("worker %s starting: %s on %s (capacity %d, handlers: %s)", q.worker_id,
                 target, safe_url(the_url), q.capacity, ", ".join(sorted(q._handlers)) or "-")
        await connect(q, the_url)
        try:
            await run_worker(q)
        finally:
            await q.close()
        log.info("worker %s stopped", q.worker_id)

    run(the_url, go)


def load_queue(target: str, *, factory: bool = False) -> JobQueue:
    mod_name, sep, attr = target.partition(":")
    if not sep or not mod_name or not attr:
        raise typer.BadParameter(f"expected MODULE:QUEUE, e.g. myapp.jobs:queue, got {target!r}",
                                 param_hint="MODULE:QUEUE")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        if exc.name and (mod_name == exc.name or mod_name.startswith(exc.name + ".")):
            raise typer.BadParameter(f"cannot import {mod_name!r}: {exc}",
                                     param_hint="MODULE:QUEUE") from None
        raise
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise typer.BadParameter(f"module {mod_name!r} has no attribute {attr!r}",
                                     param_hint="MODULE:QUEUE")
        obj = getattr(obj, part)
    if factory:
        if not callable(obj):
            raise typer.BadParameter(f"{target} is not callable", param_hint="--factory")
        obj = obj()
    if not isinstance(obj, JobQueue):
        hint = " (a factory? add --factory)" if callable(obj) else ""
        raise typer.BadParameter(f"{target} is a {type(obj).__name__}, not a JobQueue{hint}",
                                 param_hint="MODULE:QUEUE")
    return obj


@app.command()
def status(
    url: Url = DEFAULT_URL,
    prefix: Prefix = DEFAULT_PREFIX,
    recent: Annotated[float, typer.Option(
        help="Workers whose last heartbeat is at most this many seconds old count as live.")
    ] = 60.0,
    as_json: AsJson = False,
) -> None:
    """Counts per group and state, the oldest ready job, live workers."""
    url = resolve_url(url)

    async def go() -> admin.Status:
        async with opened(url, prefix) as q:
            return await admin.status(q, recent=recent)

    st = run(url, go)
    if as_json:
        emit_json(st)
        return
    cols = ("running", "ready", "scheduled", "waiting", "done", "failed", "cancelled")
    t = Table(title=f"aiojobqueue at {escape(safe_url(url))}", header_style="bold",
              title_justify="left", box=box.SIMPLE_HEAD, collapse_padding=True)
    t.add_column("group", min_width=6, overflow="fold")
    for c in cols:
        t.add_column(c, justify="right", no_wrap=True)
    t.add_column("oldest", justify="right", no_wrap=True)
    for g in st.groups:
        t.add_row(escape(g.group), *(_n(g.count(c), c) for c in cols), ago(g.oldest_ready_age))
    if len(st.groups) > 1:
        t.add_section()
        t.add_row("[bold]all[/]", *(_n(st.totals.get(c, 0), c) for c in cols),
                  ago(st.oldest_ready_age))
    if not st.groups:
        t.add_row("[dim]no jobs[/]", *("" for _ in cols), "")
    out.print(t)
    if st.containers:
        out.print("containers: " + ", ".join(f"{n} {s}" for s, n in sorted(st.containers.items())))
    if st.releasing:
        out.print(f"{st.releasing} part(s) of split releases pending: waiting jobs whose "
                  "upstream is done, released by any worker (a worker's sweep if theirs died)")
    w = Table(title=f"workers seen in the last {st.recent:g}s", header_style="bold",
              title_justify="left", box=box.SIMPLE_HEAD)
    for c in ("worker", "host", "pid", "running", "last seen", "up since"):
        w.add_column(c, justify="right" if c in ("pid", "running", "last seen") else "left")
    for wk in st.workers:
        w.add_row(wk.id, escape(wk.host), str(wk.pid), str(wk.running),
                  f"{ago(wk.seen_ago)} ago", when(wk.started_at))
    if not st.workers:
        w.add_row("[dim]none[/]", "", "", "", "", "")
    out.print(w)
    if st.stale_workers:
        out.print(f"[dim]{st.stale_workers} registered worker(s) not seen for more than "
                  f"{st.recent:g}s (stopped or dead; `aiojobqueue prune` removes old ones)[/]")


def _n(n: int, state: str) -> Text:
    from .demo import STATE_STYLE

    return Text(str(n), style=STATE_STYLE.get(state, "") if n else "dim")


@app.command()
def jobs(
    url: Url = DEFAULT_URL,
    prefix: Prefix = DEFAULT_PREFIX,
    state: Annotated[str | None, typer.Option(
        help="waiting, scheduled, ready, running, active, done, failed or cancelled.")] = None,
    group: Annotated[str | None, typer.Option(help="Only this group.")] = None,
    type_: Annotated[str | None, typer.Option("--type", help="Only this job type.")] = None,
    parent: Annotated[int | None, typer.Option(help="Only children of this container.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many, newest first.")] = 50,
    as_json: AsJson = False,
) -> None:
    """List jobs, newest first."""
    url = resolve_url(url)

    async def go() -> tuple[list[Job], datetime]:
        async with opened(url, prefix) as q:
            return (await admin.list_jobs(q, state=state, group=group, type=type_,
                                          parent=parent, limit=limit), await admin.now(q))

    found, now = run(url, go)
    if as_json:
        emit_json(found)
        return
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, collapse_padding=True)
    for c in ("id", "type", "state", "group", "attempt", "parent", "depends on", "age", "error"):
        t.add_column(c, justify="right" if c in ("id", "attempt", "parent", "age") else "left",
                     overflow="fold" if c == "error" else "ellipsis")
    for j in found:
        t.add_row(
            str(j.id), escape(j.type) + (" [dim](container)[/]" if j.is_container else ""),
            styled(str(j.state)), escape(j.group),
            "" if j.is_container else f"{j.attempts}/{j.max_attempts}",
            str(j.parent_id or ""),
            _ids(j.depends_on) if len(j.depends_on) <= 3 else f"{len(j.depends_on)} jobs",
            ago((now - j.created_at).total_seconds()), escape(_err(j)),
        )
    out.print(t)
    if not found:
        out.print("[dim]no jobs match[/]")


def _ids(ids: tuple[int, ...], n: int = 4) -> str:
    text = ", ".join(str(i) for i in ids[:n])
    return text + (f", … (+{len(ids) - n})" if len(ids) > n else "")


def _err(j: Job) -> str:
    if not j.error:
        return ""
    return f"{j.error.get('type', '')}: {j.error.get('message', '')}"[:120]


def _label(j: Job, me: bool = False) -> Text:
    t = Text()
    t.append(f"#{j.id} ", style="bold" if me else "")
    t.append(j.type, style="bold underline" if me else "bold")
    t.append(" (container)" if j.is_container else "", style="dim")
    t.append("  ")
    t.append_text(styled(str(j.state)))
    if not j.is_container and j.attempts:
        t.append(f"  attempt {j.attempts}/{j.max_attempts}", style="dim")
    if j.group != "default":
        t.append(f"  [{j.group}]", style="dim")
    if j.error and j.state in ("failed", "cancelled", "scheduled"):
        t.append(f"  {_err(j)}", style="red" if j.state == "failed" else "magenta")
    return t


@app.command()
def show(
    job_id: Annotated[int, typer.Argument(metavar="ID", help="The job id.")],
    url: Url = DEFAULT_URL,
    prefix: Prefix = DEFAULT_PREFIX,
    traceback: Annotated[bool, typer.Option(help="Print the error's traceback.")] = False,
    limit: Annotated[int, typer.Option(
        min=1, help="Show at most this many children and dependents.")] = 20,
    as_json: AsJson = False,
) -> None:
    """One job with its DAG: containers above it, children, dependencies, dependents."""
    url = resolve_url(url)

    async def go() -> tuple[admin.JobGraph, datetime]:
        async with opened(url, prefix) as q:
            return await admin.graph(q, job_id, limit=limit), await admin.now(q)

    g, now = run(url, go)
    if as_json:
        emit_json(g)
        return
    j = g.job
    info = Table.grid(padding=(0, 2))
    info.add_column(style="bold")
    info.add_column()
    info.add_row("state", styled(str(j.state)))
    info.add_row("kind", "container" if j.is_container else "job")
    info.add_row("group", f"{escape(j.group)} (weight {j.weight}, priority {j.priority})")
    if not j.is_container:
        info.add_row("attempts", f"{j.attempts} of {j.max_attempts}")
        info.add_row("args", escape(_short(j.args)))
    if j.key:
        info.add_row("key", escape(j.key))
    info.add_row("created", when(j.created_at, now))
    if j.run_after and j.state in ("scheduled", "waiting"):
        info.add_row("run after", when(j.run_after, now))
    if j.started_at:
        info.add_row("started", when(j.started_at, now))
    if j.finished_at:
        info.add_row("finished", when(j.finished_at, now))
    if j.lease_owner:
        info.add_row("leased by", j.lease_owner)
    if j.result is not None:
        info.add_row("result", escape(_short(j.result)))
    if j.error:
        info.add_row("error", Text(_err(j), style="red"))
    out.print(Panel(info, title=f"job #{j.id} · {escape(j.type)}", title_align="left",
                    border_style="blue"))

    # The DAG: the container chain down to this job, then its edges and children.
    root = Tree(Text("DAG", style="bold"), guide_style="dim")
    node = root
    for a in g.ancestors:
        node = node.add(_label(a))
    me = node.add(_label(j, me=True))
    if g.dependencies:
        ups = me.add(Text(f"depends on ({len(g.dependencies)})", style="bold cyan"))
        for d in g.dependencies:
            ups.add(_label(d))
    if g.children_total:
        states = ", ".join(f"{n} {s}" for s, n in sorted(g.children_states.items()))
        kids = me.add(Text(f"children ({g.children_total}: {states})", style="bold cyan"))
        for c in g.children:
            kids.add(_label(c))
        if g.children_total > len(g.children):
            kids.add(Text(f"… {g.children_total - len(g.children)} more "
                          f"(aiojobqueue jobs --parent {j.id})", style="dim"))
    if g.dependents_total:
        downs = me.add(Text(f"needed by ({g.dependents_total})", style="bold cyan"))
        for d in g.dependents:
            downs.add(_label(d))
        if g.dependents_total > len(g.dependents):
            downs.add(Text(f"… {g.dependents_total - len(g.dependents)} more", style="dim"))
    out.print(root)
    if traceback and j.error and j.error.get("traceback"):
        out.print(Panel(escape(j.error["traceback"].rstrip()), title="traceback",
                        border_style="red"))


def _short(value: Any, n: int = 200) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= n else text[: n - 1] + "…"


@app.command()
def retry(
    job_id: Annotated[int, typer.Argument(metavar="ID")],
    url: Url = DEFAULT_URL,
    prefix: Prefix = DEFAULT_PREFIX,
    as_json: AsJson = False,
) -> None:
    """Make a failed or cancelled job runnable again, with the jobs its end cancelled."""
    url = resolve_url(url)

    async def go() -> list[int]:
        async with opened(url, prefix) as q:
            return await admin.retry(q, job_id)

    ids = run(url, go)
    if as_json:
        emit_json({"job_id": job_id, "revived": ids})
        return
    others = [i for i in ids if i != job_id]
    more = f" and {len(others)} job(s) it had cancelled or failed: {_ids(tuple(others), 10)}" \
        if others else ""
    out.print(f"[green]retrying[/] job {job_id}{more}")


@app.command()
def cancel(
    job_id: Annotated[int, typer.Argument(metavar="ID")],
    url: Url = DEFAULT_URL,
    prefix: Prefix = DEFAULT_PREFIX,
    as_json: AsJson = False,
) -> None:
    """Cancel a job or container and everything waiting on it."""
    url = resolve_url(url)

    async def go() -> str:
        async with opened(url, prefix) as q:
            return await admin.cancel(q, job_id)

    state = run(url, go)
    code = Exit.FAILED if state in ("done", "failed") else Exit.OK
    if as_json:
        emit_json({"job_id": job_id, "state": state, "ok": code == Exit.OK})
    elif state == "running":
        out.print(f"[yellow]cancel requested[/]: job {job_id} is running; its worker stops it "
                  "within a heartbeat interval")
    elif state == "cancelled":
        out.print(f"[magenta]cancelled[/] job {job_id} (and whatever waited on it)")
    else:
        err.print(f"[bold red]error:[/] job {job_id} is already {state}; nothing to cancel")
    if code != Exit.OK:
        raise typer.Exit(code)


@app.command()
def migrate(
    url: Url = DEFAULT_URL,
    prefix: Prefix = DEFAULT_PREFIX,
    check: Annotated[bool, typer.Option(
        "--check", help="Change nothing; exit 4 unless the schema is current.")] = False,
) -> None:
    """Create the tables, or upgrade them in place to this version's schema."""
    from .migrate import current_version
    from .schema import SCHEMA_VERSION

    url = resolve_url(url)

    async def go() -> tuple[int, int]:
        async with opened(url, prefix, migrate=not check, must_exist=check) as q:
            return await current_version(q._started().db) or 0, SCHEMA_VERSION

    before_now = run(url, go)  # with --check, a stale schema raised SchemaError (exit 4)
    found, target = before_now
    where = escape(safe_url(url))
    if check:
        out.print(f"schema {prefix}* at {where} is current (version {found})")
    else:
        out.print(f"schema {prefix}* at {where} is at version {target}")


@app.command()
def prune(
    older_than: Annotated[str, typer.Option(
        "--older-than", metavar="AGE",
        help="Delete jobs that finished longer ago than this: 30m, 12h, 7d, 2w, 1d12h.")],
    url: Url = DEFAULT_URL,
    prefix: Prefix = DEFAULT_PREFIX,
    dry_run: Annotated[bool, typer.Option(help="Count, delete nothing.")] = False,
    as_json: AsJson = False,
) -> None:
    """Delete old finished jobs, keeping the DAG whole.

    A top-level job goes with its whole container tree, only when all of it finished before
    the cutoff and no live job depends on any of it; edges go with their jobs."""
    url = resolve_url(url)
    try:
        age = admin.parse_age(older_than)
    except InvalidJobError as exc:
        raise typer.BadParameter(str(exc), param_hint="--older-than") from None

    async def go() -> admin.PruneResult:
        async with opened(url, prefix) as q:
            return await admin.prune(q, age, dry_run=dry_run)

    res = run(url, go)
    if as_json:
        emit_json(res)
        return
    verb = "would delete" if dry_run else "deleted"
    out.print(f"{verb} {res.jobs} job(s), {res.edges} edge(s) and {res.workers} worker record(s) "
              f"finished before {when(res.cutoff)} UTC")
    if res.kept:
        out.print(f"[dim]kept {res.kept} finished tree(s) old enough but still needed "
                  "(a live job depends on them, or part of the tree is live or newer)[/]")


def main() -> None:
    """Entry point of the ``aiojobqueue`` console script."""
    try:
        app()
    except CLIError as e:  # raised outside run(), e.g. a bad URL while parsing
        err.print(f"[bold red]error:[/] {escape(str(e))}")
        sys.exit(e.code)

"""``aiojobqueue demo``: a realistic DAG on embedded SQLite, with a live view.

Two tenants share a scarce global budget of 4 concurrent jobs (think: API tokens or GPUs).
Each tenant's nightly pipeline is a container holding a fan-out of ``fetch`` jobs, one
``parse`` per fetch and a fan-in ``merge``; a ``report`` waits for the whole container, and
one ``publish`` waits for both reports. ``acme`` has weight 3 and ``globex`` weight 1, so
while both have work acme gets about three of the four slots. One of globex's fetches fails
on its first attempt (a simulated HTTP 503) and succeeds when retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from . import admin
from .batch import JobRef
from .hooks import JobEvent
from .queue import JobQueue

TENANTS = {"acme": 3, "globex": 1}
SOURCES = 16
CONCURRENCY = 4
FLAKY = ("globex", 5)  # (tenant, source index) of the fetch that fails once

STATE_STYLE = {
    "waiting": "grey58", "scheduled": "yellow", "ready": "cyan", "running": "bold blue",
    "leased": "blue",
    "active": "blue", "done": "green", "failed": "bold red", "cancelled": "magenta",
}


@dataclass
class DemoRun:
    """What happened, for the summary table and ``--json``."""

    url: str
    started: float = field(default_factory=time.monotonic)
    elapsed: float = 0.0
    ids: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    weights: dict[str, int] = field(default_factory=lambda: dict(TENANTS))
    flaky_id: int = 0
    publish_id: int = 0
    done_times: deque[float] = field(default_factory=deque)
    events: deque[Text] = field(default_factory=lambda: deque(maxlen=7))
    busy: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    finished_at: dict[str, float] = field(default_factory=dict)
    attempts: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    contended: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))


def build_queue(url: str, prefix: str, speed: float) -> JobQueue:
    """The demo's queue and handlers. ``speed`` > 1 makes every job proportionally shorter."""
    q = JobQueue(
        url, prefix=prefix, concurrency=CONCURRENCY, capacity=8, poll_interval=0.1,
        heartbeat_interval=1.0, lease_ttl=5.0, retry_backoff=0.6 / speed,
        retry_backoff_max=1.0, shutdown_timeout=2.0,
    )

    async def work(seconds: float) -> None:
        await asyncio.sleep(seconds * random.uniform(0.7, 1.3) / speed)

    @q.handler("fetch", timeout=30, max_attempts=3)
    async def fetch(ctx: Any, tenant: str, source: int) -> dict[str, Any]:
        await work(0.7)
        if (tenant, source) == FLAKY and ctx.attempt == 1:
            raise ConnectionError(f"HTTP 503 from {tenant}-source-{source}: try again later")
        return {"rows": 100 + 7 * source}

    @q.handler("parse")
    async def parse(ctx: Any, tenant: str, source: int) -> dict[str, Any]:
        await work(0.3)
        (fetched,) = (await ctx.dependency_results()).values()
        return {"records": fetched["rows"] // 2}

    @q.handler("merge")
    async def merge(ctx: Any, tenant: str) -> dict[str, Any]:
        await work(0.5)
        parts = await ctx.dependency_results()
        return {"records": sum(p["records"] for p in parts.values()), "parts": len(parts)}

    @q.handler("report")
    async def report(ctx: Any, tenant: str) -> dict[str, Any]:
        await work(0.5)
        return {"tenant": tenant, "url": f"https://reports.example/{tenant}/nightly.pdf"}

    @q.handler("publish")
    async def publish(ctx: Any) -> dict[str, Any]:
        await work(0.3)
        reports = await ctx.dependency_results()
        return {"published": sorted(r["tenant"] for r in reports.values())}

    return q


async def enqueue_dag(q: JobQueue, run: DemoRun) -> None:
    """The whole DAG in one transaction."""
    refs: dict[str, list[JobRef]] = defaultdict(list)
    async with q.batch() as b:
        reports = []
        for tenant, weight in TENANTS.items():
            box = b.container(f"{tenant}-nightly", group=tenant, weight=weight)
            parses = []
            for s in range(SOURCES):
                f = b.add("fetch", {"tenant": tenant, "source": s}, parent=box, group=tenant,
                          weight=weight)
                p = b.add("parse", {"tenant": tenant, "source": s}, parent=box, group=tenant,
                          weight=weight, depends_on=[f])
                parses.append(p)
                refs[tenant] += [f, p]
                if (tenant, s) == FLAKY:
                    flaky = f
            m = b.add("merge", {"tenant": tenant}, parent=box, group=tenant, weight=weight,
                      depends_on=parses)
            r = b.add("report", {"tenant": tenant}, group=tenant, weight=weight,
                      depends_on=[box])
            refs[tenant] += [box, m, r]
            reports.append(r)
        pub = b.add("publish", {}, group="ops", depends_on=reports)
        refs["ops"] = [pub]
    for t, rs in refs.items():
        run.ids[t] = [ref.id for ref in rs]
    run.flaky_id = flaky.id
    run.publish_id = pub.id


def attach_hooks(q: JobQueue, run: DemoRun) -> None:
    def on_event(ev: JobEvent) -> None:
        t = time.monotonic() - run.started
        run.outcomes[ev.event] += 1
        if ev.event == "start":
            run.attempts[ev.type] += 1
            return
        run.busy[ev.group] += ev.duration or 0.0
        if ev.event == "done":
            run.done_times.append(time.monotonic())
            run.finished_at[ev.group] = t
            if ev.job_id == run.flaky_id or ev.type in ("merge", "report", "publish"):
                note = " (on attempt 2)" if ev.job_id == run.flaky_id else ""
                run.events.append(Text.assemble(
                    (f"{t:5.1f}s ", "dim"), ("✓ ", "green"),
                    f"#{ev.job_id} {ev.type} [{ev.group}] done{note}"))
        elif ev.event == "retry":
            msg = (ev.error or {}).get("message", "")
            run.events.append(Text.assemble(
                (f"{t:5.1f}s ", "dim"), ("↻ ", "yellow"),
                f"#{ev.job_id} {ev.type} [{ev.group}] attempt {ev.attempt} failed: ",
                (msg, "yellow"), f" - retry in {ev.retry_in or 0:.1f}s"))
        else:
            run.events.append(Text.assemble(
                (f"{t:5.1f}s ", "dim"), ("✗ ", "red"), f"#{ev.job_id} {ev.type} {ev.event}"))

    for name in ("start", "done", "retry", "failed", "cancelled"):
        q.on(name, on_event)


def observe(run: DemoRun, st: admin.Status) -> None:
    """Sample slot use while both tenants have work waiting: that is where weights show."""
    busy = {g.group: g.count("running") for g in st.groups if g.count("ready")}
    if len(busy) >= 2:
        for name, n in busy.items():
            run.contended[name].append(n)


def _quiet_events(run: DemoRun) -> str:
    """The event panel's line before its first event: the panel lists merges, reports and
    retries, so while only fetches and parses have finished it says so."""
    done = run.outcomes["done"]
    if not done:
        return "waiting for the first results…"
    return (f"{done} fetch/parse job(s) done so far; merges, reports and retries "
            "will show here")


def render(run: DemoRun, st: admin.Status | None, width: int = 100) -> Group:
    """The live view: per-group progress and states, totals, throughput, recent events."""
    bar = min(26, max(6, width - 66))
    elapsed = time.monotonic() - run.started
    now = time.monotonic()
    while run.done_times and now - run.done_times[0] > 3.0:
        run.done_times.popleft()
    table = Table(expand=False, box=None, pad_edge=False, header_style="bold",
                  collapse_padding=True)
    table.add_column("group")
    table.add_column("weight", justify="right")
    table.add_column("progress", width=bar)
    for s in ("running", "ready", "scheduled", "waiting", "done", "failed"):
        table.add_column(s, justify="right", style=STATE_STYLE[s])
    totals: Counter[str] = Counter()
    if st is not None:
        for g in st.groups:
            total = sum(g.counts.values())
            totals.update(g.counts)
            done = g.count("done")
            table.add_row(
                g.group, str(run.weights.get(g.group, 1)),
                ProgressBar(total=max(total, 1), completed=done, width=bar),
                *(str(g.count(s)) for s in ("running", "ready", "scheduled", "waiting",
                                            "done", "failed")),
            )
    all_jobs = sum(totals.values())
    rate_now = len(run.done_times) / 3.0
    rate_avg = totals["done"] / elapsed if elapsed > 0 else 0.0
    line = Text.assemble(
        ("jobs ", "bold"), f"{totals['done']}/{all_jobs} done", "   ",
        ("running ", "bold"), f"{totals['running']}/{CONCURRENCY} slots", "   ",
        ("throughput ", "bold"), f"{rate_now:4.1f} jobs/s now, {rate_avg:4.1f} avg", "   ",
        ("elapsed ", "bold"), f"{elapsed:4.1f}s",
    )
    if st is not None and st.containers:
        line.append("   containers ", style="bold")
        line.append(", ".join(f"{n} {s}" for s, n in sorted(st.containers.items())))
    events = Group(*run.events) if run.events else Text(_quiet_events(run), style="dim")
    return Group(
        Panel(table, title="[bold]aiojobqueue demo[/] - two tenants, one budget of "
              f"{CONCURRENCY} slots", subtitle=run.url, border_style="blue"),
        line,
        Panel(events, title="events (from queue.on hooks)", border_style="dim"),
    )


async def run_demo(
    url: str, prefix: str, *, speed: float = 1.0, live: bool = True,
    console: Console | None = None,
) -> tuple[DemoRun, dict[int, Any]]:
    """Build the DAG, run it to completion while showing the live view; returns the run and
    every demo job's final snapshot by id."""
    console = console or Console()
    q = build_queue(url, prefix, speed)
    run = DemoRun(url)
    attach_hooks(q, run)
    async with q:
        await enqueue_dag(q, run)
        run.started = time.monotonic()
        worker = asyncio.create_task(q.run_until_idle())
        try:
            st: admin.Status | None = None
            view = Live(render(run, st, console.width), console=console, refresh_per_second=8,
                        transient=False) if live else None
            with view if view is not None else contextlib.nullcontext():
                while not worker.done():
                    st = await admin.status(q)
                    observe(run, st)
                    if view is not None:
                        view.update(render(run, st, console.width))
                    await asyncio.wait({worker}, timeout=0.25)
                st = await admin.status(q)
                if view is not None:
                    view.update(render(run, st, console.width))
        finally:
            # Ctrl-C cancels this task, not the worker's: stop the worker while the queue is
            # still open, so it shuts down gracefully (running jobs finish or are released,
            # and it leaves the worker registry) instead of dying with the event loop.
            if not worker.done():
                worker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await worker
        await worker  # re-raise a worker crash
        run.elapsed = time.monotonic() - run.started
        ids = [i for v in run.ids.values() for i in v]
        jobs = {i: await q.get(i) for i in ids}
    return run, jobs


def summary_table(run: DemoRun, jobs: dict[int, Any]) -> Table:
    t = Table(title=f"finished in {run.elapsed:.1f}s", header_style="bold", box=box.SIMPLE_HEAD)
    t.add_column("group")
    t.add_column("weight", justify="right")
    t.add_column("jobs", justify="right")
    t.add_column("final states")
    t.add_column("slots while contended", justify="right")
    t.add_column("busy slot-s", justify="right")
    t.add_column("done at", justify="right")
    for g, ids in run.ids.items():
        states = Counter(str(jobs[i].state) for i in ids if not jobs[i].is_container)
        held = run.contended.get(g)
        t.add_row(
            g, str(run.weights.get(g, 1)), str(sum(states.values())),
            ", ".join(f"[{STATE_STYLE.get(s, '')}]{n} {s}[/]" for s, n in sorted(states.items())),
            f"{sum(held) / len(held):.1f} of {CONCURRENCY}" if held else "-",
            f"{run.busy.get(g, 0.0):.1f}",
            f"{run.finished_at[g]:.1f}s" if g in run.finished_at else "-",
        )
    return t


def containers_line(run: DemoRun, jobs: dict[int, Any]) -> str:
    boxes = [j for j in jobs.values() if j.is_container]
    return "containers: " + ", ".join(
        f"{j.type} [{STATE_STYLE.get(str(j.state), '')}]{j.state}[/]" for j in boxes)


def verdict(run: DemoRun, jobs: dict[int, Any]) -> dict[str, Any]:
    """The machine-readable summary; ``ok`` is True when every job ended as expected."""
    states = Counter(str(j.state) for j in jobs.values())
    flaky = jobs[run.flaky_id]
    ok = (states == Counter({"done": len(jobs)}) and flaky.attempts == 2
          and jobs[run.publish_id].result == {"published": sorted(TENANTS)})
    return {
        "ok": ok,
        "url": run.url,
        "elapsed": round(run.elapsed, 3),
        "jobs": len(jobs),
        "states": dict(states),
        "groups": {g: {"jobs": len(ids), "weight": run.weights.get(g, 1),
                       "busy_seconds": round(run.busy.get(g, 0.0), 3),
                       "finished_at": round(run.finished_at.get(g, 0.0), 3)}
                   for g, ids in run.ids.items()},
        "attempts": dict(run.attempts),
        "events": dict(run.outcomes),
        "flaky_job": {"id": flaky.id, "state": str(flaky.state), "attempts": flaky.attempts},
        "publish_job": {"id": run.publish_id, "result": jobs[run.publish_id].result},
    }

"""``schedules`` (list the schedules table) and ``schedule pause|resume|trigger NAME``."""

from __future__ import annotations

from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from ..schedules import ScheduleInfo
from ..schema import DEFAULT_PREFIX
from .app import AsJson, Prefix, Url, app
from .render import when
from .runtime import DEFAULT_URL, emit_json, normalize_url, out, run_on

schedule_app = typer.Typer(
    name="schedule", no_args_is_help=True, add_completion=False, rich_markup_mode=None,
    help="Pause, resume or trigger one periodic schedule (every worker follows the row).")
app.add_typer(schedule_app)

Name = Annotated[str, typer.Argument(metavar="NAME", help="The schedule's name.")]


@app.command()
def schedules(url: Url = DEFAULT_URL, prefix: Prefix = DEFAULT_PREFIX,
              as_json: AsJson = False) -> None:
    """List the periodic schedules: name, cron or period, time zone, paused, the last slot
    enqueued (usually still to come: a slot is enqueued one period early) and the next."""
    url = normalize_url(url)
    rows = run_on(url, prefix, lambda q: q.schedules())
    if as_json:
        emit_json(rows)
        return
    if not rows:
        out.print("no periodic schedule on these tables")
        return
    out.print(schedules_table(rows))


def schedules_table(rows: list[ScheduleInfo]) -> Table:
    """The rows as a Rich table (times in UTC, as everywhere in the command line)."""
    t = Table(box=box.SIMPLE_HEAD)
    for col in ("name", "type", "cron / period", "tz", "paused", "last slot", "its job",
                "next slot"):
        t.add_column(col, no_wrap=col in ("name", "last slot", "next slot"))
    for r in rows:
        t.add_row(escape(r.name), escape(r.type or "(not declared)"), escape(r.period or "—"),
                  escape(r.tz or "UTC"), "[yellow]paused[/]" if r.paused else "no",
                  when(r.last_slot), r.last_state or "—", when(r.next_slot))
    return t


@schedule_app.command()
def pause(name: Name, url: Url = DEFAULT_URL, prefix: Prefix = DEFAULT_PREFIX) -> None:
    """Stop every worker enqueuing NAME's slots (the one enqueued ahead is cancelled unless
    it started)."""
    url = normalize_url(url)
    changed = run_on(url, prefix, lambda q: q.pause_schedule(name))
    out.print(f"[yellow]paused[/] schedule {escape(name)}" if changed
              else f"schedule {escape(name)} was already paused")


@schedule_app.command()
def resume(name: Name, url: Url = DEFAULT_URL, prefix: Prefix = DEFAULT_PREFIX) -> None:
    """Enqueue NAME's slots again, from the next one (slots missed meanwhile are skipped)."""
    url = normalize_url(url)
    changed = run_on(url, prefix, lambda q: q.resume_schedule(name))
    out.print(f"[green]resumed[/] schedule {escape(name)}" if changed
              else f"schedule {escape(name)} was not paused")


@schedule_app.command()
def trigger(name: Name, url: Url = DEFAULT_URL, prefix: Prefix = DEFAULT_PREFIX,
            as_json: AsJson = False) -> None:
    """Enqueue one job of NAME now, outside its slots (paused or not)."""
    url = normalize_url(url)
    job_id = run_on(url, prefix, lambda q: q.trigger_schedule(name))
    if as_json:
        emit_json({"schedule": name, "job_id": job_id})
        return
    out.print(f"[green]triggered[/] schedule {escape(name)}: job {job_id}")

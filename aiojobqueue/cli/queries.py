"""The read commands: ``status``, ``jobs``, ``show``. Each opens the queue without creating
anything, asks ``aiojobqueue.admin``, and prints ``render``'s view or ``--json``."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import typer

from .. import admin, fleet
from ..models import Job
from ..queue import JobQueue
from ..schema import DEFAULT_PREFIX
from . import render
from .app import AsJson, Prefix, Url, app
from .runtime import DEFAULT_URL, emit_json, normalize_url, out, run_on


@app.command()
def status(
    url: Url = DEFAULT_URL,
    prefix: Prefix = DEFAULT_PREFIX,
    recent: Annotated[float, typer.Option(
        help="Workers whose last heartbeat is at most this many seconds old count as live.")
    ] = 60.0,
    as_json: AsJson = False,
) -> None:
    """Counts per group and state, the oldest ready job, live workers; flags job types with
    runnable jobs that no live worker serves, and groups held at their cap."""
    url = normalize_url(url)

    async def go(q: JobQueue) -> tuple[admin.Status, dict[str, int], list[fleet.GroupAtCap]]:
        return (await admin.status(q, recent=recent), await fleet.unserved_types(q),
                await fleet.groups_at_cap(q))

    st, unserved, at_cap = run_on(url, prefix, go)
    if as_json:
        emit_json({**admin.to_data(st), "unserved_types": unserved,
                   "groups_at_cap": at_cap})
        return
    for part in render.status_view(st, url, fleet.notes_of(unserved, at_cap)):
        out.print(part)


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
    tag: Annotated[str | None, typer.Option(help="Only jobs carrying this tag.")] = None,
) -> None:
    """List jobs, newest first."""
    url = normalize_url(url)

    async def go(q: JobQueue) -> tuple[list[Job], datetime]:
        return (await admin.list_jobs(q, state=state, group=group, type=type_,
                                      parent=parent, limit=limit, tag=tag), await admin.now(q))

    found, now = run_on(url, prefix, go)
    if as_json:
        emit_json(found)
        return
    out.print(render.jobs_table(found, now))


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
    url = normalize_url(url)

    async def go(q: JobQueue) -> tuple[admin.JobGraph, datetime]:
        return await admin.graph(q, job_id, limit=limit), await admin.now(q)

    g, now = run_on(url, prefix, go)
    if as_json:
        emit_json(g)
        return
    for part in render.job_view(g, now, traceback=traceback):
        out.print(part)

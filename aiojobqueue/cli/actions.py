"""The commands that change the database: ``retry``, ``cancel``, ``migrate``, ``prune``."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from .. import admin
from .. import prune as pruning
from ..errors import InvalidJobError
from ..schema import DEFAULT_PREFIX
from .app import AsJson, Prefix, Url, app
from .render import ids, when
from .runtime import (
    DEFAULT_URL,
    Exit,
    emit_json,
    normalize_url,
    opened,
    out,
    print_error,
    run,
    run_on,
    safe_url,
)


@app.command()
def retry(
    job_id: Annotated[int, typer.Argument(metavar="ID")],
    url: Url = DEFAULT_URL,
    prefix: Prefix = DEFAULT_PREFIX,
    as_json: AsJson = False,
) -> None:
    """Make a failed or cancelled job runnable again, with the jobs its end cancelled."""
    url = normalize_url(url)

    revived = run_on(url, prefix, lambda q: admin.retry(q, job_id))
    if as_json:
        emit_json({"job_id": job_id, "revived": revived})
        return
    others = [i for i in revived if i != job_id]
    more = f" and {len(others)} job(s) it had cancelled or failed: {ids(tuple(others), 10)}" \
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
    url = normalize_url(url)

    state = run_on(url, prefix, lambda q: admin.cancel(q, job_id))
    code = Exit.FAILED if state in ("done", "failed") else Exit.OK
    if as_json:
        emit_json({"job_id": job_id, "state": state, "ok": code == Exit.OK})
    elif state == "running":
        out.print(f"[yellow]cancel requested[/]: job {job_id} is running; its worker stops it "
                  "within a heartbeat interval")
    elif state == "cancelled":
        out.print(f"[magenta]cancelled[/] job {job_id} (and whatever waited on it)")
    else:
        print_error(f"job {job_id} is already {state}; nothing to cancel")
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
    from ..migrate import current_version
    from ..schema import SCHEMA_VERSION

    url = normalize_url(url)

    async def go() -> int:
        async with opened(url, prefix, migrate=not check, must_exist=check) as q:
            return await current_version(q._started().db) or 0

    found = run(url, go)  # with --check, a stale schema raised SchemaError (exit 4)
    where = escape(safe_url(url))
    if check:
        out.print(f"schema {prefix}* at {where} is current (version {found})")
    else:
        out.print(f"schema {prefix}* at {where} is at version {SCHEMA_VERSION}")


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
    url = normalize_url(url)
    try:
        age = pruning.parse_age(older_than)
    except InvalidJobError as exc:
        raise typer.BadParameter(str(exc), param_hint="--older-than") from None

    res = run_on(url, prefix, lambda q: pruning.prune(q, age, dry_run=dry_run))
    if as_json:
        emit_json(res)
        return
    verb = "would delete" if dry_run else "deleted"
    out.print(f"{verb} {res.jobs} job(s), {res.edges} edge(s) and {res.workers} worker record(s) "
              f"finished before {when(res.cutoff)} UTC")
    if res.kept:
        out.print(f"[dim]kept {res.kept} finished tree(s) old enough but still needed "
                  "(a live job depends on them, or part of the tree is live or newer)[/]")

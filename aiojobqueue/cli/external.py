"""``complete`` and ``fail``: end an external step from the command line (external.py)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from ..schema import DEFAULT_PREFIX
from .app import AsJson, Prefix, Url, app
from .runtime import DEFAULT_URL, emit_json, normalize_url, out, run_on


@app.command()
def complete(
    job_id: Annotated[int, typer.Argument(metavar="ID")],
    result: Annotated[str | None, typer.Option(
        "--result", metavar="JSON", help="The step's result, as JSON (default: null).")] = None,
    url: Url = DEFAULT_URL,
    prefix: Prefix = DEFAULT_PREFIX,
    as_json: AsJson = False,
) -> None:
    """End an external step as done (its dependents run); exit 1, changing nothing, if it
    is not waiting for completion (already done, failed, timed out, or not external)."""
    url = normalize_url(url)
    value: Any = None
    if result is not None:
        try:
            value = json.loads(result)
        except ValueError as exc:
            raise typer.BadParameter(f"not JSON: {exc}", param_hint="--result") from None
    run_on(url, prefix, lambda q: q.complete(job_id, value))
    if as_json:
        emit_json({"job_id": job_id, "state": "done"})
    else:
        out.print(f"[green]completed[/] external step {job_id}")


@app.command()
def fail(
    job_id: Annotated[int, typer.Argument(metavar="ID")],
    message: Annotated[str | None, typer.Option(
        "--message", help="Why it failed (stored in the step's error).")] = None,
    url: Url = DEFAULT_URL,
    prefix: Prefix = DEFAULT_PREFIX,
    as_json: AsJson = False,
) -> None:
    """End an external step as failed (what waits on it is cancelled); exit 1, changing
    nothing, if it is not waiting for completion."""
    url = normalize_url(url)
    run_on(url, prefix, lambda q: q.fail(job_id, message))
    if as_json:
        emit_json({"job_id": job_id, "state": "failed"})
    else:
        out.print(f"[red]failed[/] external step {job_id}")

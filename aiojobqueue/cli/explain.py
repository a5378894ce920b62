"""``aiojobqueue explain ID``: why a job is not running now (``JobQueue.explain``).

The queue it opens has no settings of its own: the pauses, caps and rates it reports are
the stored policy's, what every worker follows (see ``aiojobqueue.explain``)."""

from __future__ import annotations

from typing import Annotated

import typer

from ..schema import DEFAULT_PREFIX
from . import render
from .app import AsJson, Prefix, Url, app
from .runtime import DEFAULT_URL, emit_json, normalize_url, out, run_on


@app.command()
def explain(
    job_id: Annotated[int, typer.Argument(metavar="ID", help="The job id.")],
    url: Url = DEFAULT_URL,
    prefix: Prefix = DEFAULT_PREFIX,
    as_json: AsJson = False,
) -> None:
    """Why a job is not running: what it waits on, the cap or limit that holds it, or that
    no live worker serves its type."""
    url = normalize_url(url)

    e = run_on(url, prefix, lambda q: q.explain(job_id))
    if as_json:
        emit_json(e.to_dict())
        return
    out.print(render.explain_view(e))

"""``dashboard``: the web dashboard served alone (``pip install "aiojobqueue[web]"``)."""

from __future__ import annotations

from typing import Annotated

import typer

from ..schema import DEFAULT_PREFIX
from .app import Prefix, Url, app
from .runtime import DEFAULT_URL, Exit, fail, normalize_url, run


@app.command()
def dashboard(
    url: Url = DEFAULT_URL,
    prefix: Prefix = DEFAULT_PREFIX,
    host: Annotated[str, typer.Option(help="Address to bind (only this machine by default).")]
    = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to serve on.")] = 8000,
    read_only: Annotated[bool, typer.Option(
        "--read-only", help="Pages only: hide and refuse retry, cancel and policy edits.")] = False,
) -> None:
    """Serve the web dashboard of the queue at --url until interrupted."""
    url = normalize_url(url)
    try:
        from ..web.serve import run as serve
    except ImportError as exc:
        fail(f"the dashboard needs its extra: pip install \"aiojobqueue[web]\" ({exc.name} "
             "is missing)", Exit.USAGE)
    run(url, lambda: serve(url, host, port, read_only, prefix))

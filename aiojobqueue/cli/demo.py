"""``aiojobqueue demo``: run ``aiojobqueue.demo``'s DAG with its live view, then print what
happened and the commands to explore what it left behind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ..schema import DEFAULT_PREFIX
from .app import AsJson, Prefix, app
from .runtime import Exit, emit_json, err, normalize_url, out, run, safe_url

DEMO_FILE = "aiojobqueue-demo.db"


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
    from ..demo import containers_line, run_demo, summary_table, verdict

    if url is None:
        path = Path(DEMO_FILE)
        for suffix in ("", "-wal", "-shm"):  # a fresh demo database each time
            Path(str(path) + suffix).unlink(missing_ok=True)
        url = f"sqlite+aiosqlite:///{path}"
    url = normalize_url(url)

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
        # escaped: Rich would take [web] for markup and print pip install "aiojobqueue"
        out.print(escape('and in a browser (pip install "aiojobqueue[web]"):'), soft_wrap=True)
        out.print(f"  aiojobqueue dashboard --url {u}", soft_wrap=True)
        return v

    v = run(url, go)
    if not v["ok"]:
        raise typer.Exit(Exit.FAILED)

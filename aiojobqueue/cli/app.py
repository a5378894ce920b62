"""The Typer application and the options several commands share (``--url``, ``--prefix``,
``--json``); command modules register themselves on ``app`` with ``@app.command()``."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from .. import __version__
from .runtime import DEFAULT_URL, CLIError, out, print_error

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


def main() -> None:
    """Entry point of the ``aiojobqueue`` console script."""
    try:
        app()
    except CLIError as e:  # raised outside run(), e.g. a bad URL or module while parsing
        print_error(str(e))
        sys.exit(e.code)

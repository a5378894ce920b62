"""What every command shares: exit codes, the consoles, URL handling, the one-line errors,
running a command's coroutine and opening the queue it reads.

Nothing here knows a particular command; a command module calls ``run(url, coroutine)``
and ``opened(url, prefix)`` and never prints a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from enum import IntEnum
from typing import Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from .. import admin
from ..dialects.urls import ASYNC_DRIVERS, sqlite_file
from ..errors import (
    AioJobQueueError,
    ConfigurationError,
    InvalidJobError,
    InvalidStateError,
    JobNotFoundError,
    SchemaError,
    UnsupportedDatabaseError,
)
from ..queue import JobQueue

T = TypeVar("T")

DEFAULT_URL = "sqlite+aiosqlite:///jobs.db"
CONNECT_TIMEOUT = 15.0


class Exit(IntEnum):
    """The command line's exit codes (documented in the README)."""

    OK = 0
    FAILED = 1
    USAGE = 2
    UNREACHABLE = 3
    SCHEMA = 4
    INTERRUPTED = 130


out = Console(highlight=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)  # one line per error


class CLIError(Exception):
    """A user error: printed as one ``error: ...`` line, then the process exits ``code``."""

    def __init__(self, message: str, code: Exit) -> None:
        super().__init__(message)
        self.code = code


def fail(message: str, code: Exit = Exit.FAILED) -> NoReturn:
    """Stop the command with a one-line error and an exit code."""
    raise CLIError(message, code)


def print_error(message: str) -> None:
    """The one line every user error becomes, on stderr."""
    err.print(f"[bold red]error:[/] {escape(message)}")


# -- URLs -------------------------------------------------------------------------------------
def normalize_url(url: str) -> str:
    """Add the async driver to a plain URL (``postgresql://`` -> ``postgresql+asyncpg://``),
    as ``JobQueue`` does (see ``dialects.urls.async_url``)."""
    from ..dialects.urls import async_url

    try:
        return async_url(url)
    except ConfigurationError:
        fail(f"bad database URL {url!r}: expected e.g. {DEFAULT_URL}", Exit.USAGE)


def safe_url(url: str) -> str:
    """The URL with its password hidden, for messages."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


# -- errors -----------------------------------------------------------------------------------
def error_line(exc: BaseException, url: str) -> CLIError:
    """Turn an exception into one line and an exit code; none of them shows a traceback.
    An exception that is not a user error (a bug) is re-raised."""
    from sqlalchemy.exc import (
        ArgumentError,
        DBAPIError,
        InterfaceError,
        InvalidRequestError,
        OperationalError,
    )

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
    if isinstance(exc, ModuleNotFoundError) and exc.name in ASYNC_DRIVERS:
        extra = ASYNC_DRIVERS[exc.name]
        hint = f': pip install "aiojobqueue[{extra}]"' if extra else ""
        return CLIError(f"the database driver {exc.name} is not installed{hint}", Exit.USAGE)
    if isinstance(exc, TimeoutError):
        return CLIError(f"cannot reach the database at {where}: timed out", Exit.UNREACHABLE)
    if isinstance(exc, (OperationalError, InterfaceError, OSError)):
        reason = first_line(getattr(exc, "orig", None) or exc)
        return CLIError(f"cannot reach the database at {where}: {reason}", Exit.UNREACHABLE)
    if isinstance(exc, DBAPIError):
        return CLIError(f"database error: {first_line(exc.orig or exc)}", Exit.FAILED)
    if isinstance(exc, InvalidRequestError):
        return CLIError(f"bad database URL {where!r}: {first_line(exc)}", Exit.USAGE)
    raise exc


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none)."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]


# -- running ----------------------------------------------------------------------------------
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
        e = error_line(exc, url)
        print_error(str(e))
        raise typer.Exit(e.code) from None


def run_on(url: str, prefix: str, fn: Callable[[JobQueue], Awaitable[T]]) -> T:
    """``fn`` on the started queue at ``url``: what most commands do (see ``run``)."""
    async def go() -> T:
        async with opened(url, prefix) as q:
            return await fn(q)

    return run(url, go)


@contextlib.asynccontextmanager
async def opened(url: str, prefix: str, *, migrate: bool = False,
                 must_exist: bool = True, **opts: Any) -> AsyncIterator[JobQueue]:
    """A started queue; without ``migrate`` it creates nothing and wants a current schema."""
    path = sqlite_file(url)
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
        reason = "timed out" if isinstance(exc, TimeoutError) else first_line(
            getattr(exc, "orig", None) or exc)
        fail(f"cannot reach the database at {safe_url(url)}: {reason}", Exit.UNREACHABLE)


def emit_json(data: Any) -> None:
    """``--json`` output: dataclasses, enums and datetimes as plain JSON on stdout."""
    sys.stdout.write(json.dumps(admin.to_data(data), indent=2, default=str) + "\n")

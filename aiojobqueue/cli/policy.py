"""The stored policy on the command line: ``policy`` (show), ``policy set``, ``group set``,
``pause`` and ``resume`` (SPEC revision 3; ``aiojobqueue.stored_policy`` does the work).

Bad input is one ``error:`` line, exit 2, and nothing changed: values are parsed before the
database is opened, and what only ``stored_policy`` checks (a name's length, ``"*"`` as a
paused group) raises its ``ConfigurationError`` before it writes. A change prints what it
changed, old and new, read in the transaction that wrote it.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich import box
from rich.console import RenderableType
from rich.markup import escape
from rich.table import Table

from .. import stored_policy as SP
from ..errors import ConfigurationError
from ..policy_text import parse_count as _count
from ..policy_text import parse_rate as _rate
from ..policy_text import (
    paused_names,
    policy_data,
    rate_text,
    rate_words,
)
from ..queue import JobQueue
from ..schema import DEFAULT_PREFIX
from .app import AsJson, Prefix, Url, app
from .runtime import DEFAULT_URL, Exit, emit_json, fail, normalize_url, out, run_on, safe_url

policy_app = typer.Typer(
    help="Show the policy stored in the database (no subcommand), or change it (set).",
    no_args_is_help=False, add_completion=False, rich_markup_mode=None)
group_app = typer.Typer(help="Change one group's weight, cap and rate (set).",
                        no_args_is_help=True, add_completion=False, rich_markup_mode=None)
app.add_typer(policy_app, name="policy")
app.add_typer(group_app, name="group")

Clearable = "none clears it"


def _parsed(fn: Any, *args: Any) -> Any:
    """A value parsed from an option, or a one-line usage error (exit 2)."""
    try:
        return fn(*args)
    except ConfigurationError as exc:
        fail(str(exc), Exit.USAGE)


# -- show -------------------------------------------------------------------------------------
@policy_app.callback(invoke_without_command=True)
def policy(
    ctx: typer.Context,
    url: Url = DEFAULT_URL,
    prefix: Prefix = DEFAULT_PREFIX,
    as_json: AsJson = False,
) -> None:
    """The policy every worker follows: the global cap, the queue's rate, the "*" default
    row, each group's weight, cap, rate and pause, and the paused types."""
    if ctx.invoked_subcommand is not None:
        return
    url = normalize_url(url)
    p = run_on(url, prefix, lambda q: q.policy())
    if as_json:
        emit_json(policy_data(p))
        return
    for part in policy_view(p, url, prefix):
        out.print(part)


def _dash(v: Any) -> str:
    return "-" if v is None else str(v)


def policy_view(p: SP.Policy, url: str, prefix: str) -> list[RenderableType]:
    """The policy as a few lines and a table of group rows, within 80 columns."""
    queue = "[bold red]PAUSED[/] (no job starts; running jobs finish)" if p.queue_paused \
        else "running"
    lines = [
        f"policy of {escape(prefix)}* at {escape(safe_url(url))}",
        f"  queue        {queue}",
        f"  concurrency  {_dash(p.concurrency)}"
        + ("" if p.concurrency is not None else "  (no fleet-wide cap)"),
        f"  rate         {rate_words(p.rate)}",
    ]
    types = paused_names(p, SP.TYPE)
    if types:
        lines.append(f"  paused types {escape(', '.join(types))}")
    lines.append('groups (one without a row of its own takes the cap and rate of "*"):')
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, collapse_padding=True)
    for col in ("group", "weight", "cap", "rate", "paused"):
        t.add_column(col, justify="right" if col in ("weight", "cap") else "left",
                     overflow="fold", max_width=40 if col == "group" else None)
    t.add_row("*", "-", _dash(p.default.cap), rate_text(p.default.rate), "")
    for name, g in sorted(p.groups.items()):
        t.add_row(escape(name), _dash(g.weight), _dash(g.cap), rate_text(g.rate),
                  "[red]paused[/]" if g.paused else "")
    return ["\n".join(lines), t]


# -- changes ----------------------------------------------------------------------------------
def _changes(before: SP.Policy, after: SP.Policy) -> list[str]:
    """What differs between two policies, one line each: ``concurrency: 4 -> 8``."""
    b, a = policy_data(before), policy_data(after)
    lines = []
    if b["paused"] != a["paused"]:
        lines.append("queue: " + ("paused" if a["paused"] else "resumed"))
    for key in ("concurrency", "rate"):
        if b[key] != a[key]:
            lines.append(f"{key}: {_show(key, before, b[key])} -> {_show(key, after, a[key])}")
    for key in ("cap", "rate"):
        if b["default"][key] != a["default"][key]:
            old = before.default.cap if key == "cap" else rate_text(before.default.rate)
            new = after.default.cap if key == "cap" else rate_text(after.default.rate)
            lines.append(f'group "*" {key}: {_dash(old)} -> {_dash(new)}')
    for name in sorted(set(b["groups"]) | set(a["groups"])):
        og, ng = before.groups.get(name, SP.GroupPolicy()), after.groups.get(name, SP.GroupPolicy())
        if og.paused != ng.paused:
            lines.append(f"group {name!r}: " + ("paused" if ng.paused else "resumed"))
        for key in ("weight", "cap", "rate"):
            old, new = getattr(og, key), getattr(ng, key)
            if old != new and not (key == "rate" and rate_text(old) == rate_text(new)):
                if key == "rate":
                    old, new = rate_text(old), rate_text(new)
                lines.append(f"group {name!r} {key}: {_dash(old)} -> {_dash(new)}")
    for name in sorted(set(b["paused_types"]) ^ set(a["paused_types"])):
        lines.append(f"type {name!r}: " + ("paused" if name in a["paused_types"] else "resumed"))
    return lines


def _show(key: str, p: SP.Policy, v: Any) -> str:
    if key == "rate":
        return rate_text(p.rate)
    return _dash(v)


def _apply(url: str, prefix: str, how: Any) -> None:
    """Run ``how(db)`` (a stored_policy writer, which returns the policy before it), then
    print what changed."""
    url = normalize_url(url)

    async def go(q: JobQueue) -> tuple[SP.Policy, SP.Policy]:
        db = q._started().db
        before = await how(db)
        return before, await q.policy()

    before, after = run_on(url, prefix, go)
    lines = _changes(before, after)
    out.print("\n".join(escape(x) for x in lines) if lines else "no change: already so")


@policy_app.command("set")
def policy_set(
    concurrency: Annotated[str | None, typer.Option(
        "--concurrency", metavar="N", help=f"Fleet-wide cap on running jobs; {Clearable}.")
    ] = None,
    rate: Annotated[str | None, typer.Option(
        "--rate", metavar="N/SECONDS",
        help=f"At most N starts per SECONDS for the whole queue (10/60, 10/1m); {Clearable}.")
    ] = None,
    url: Url = DEFAULT_URL,
    prefix: Prefix = DEFAULT_PREFIX,
) -> None:
    """Set the global cap and/or the queue's rate; an option left out is left as it is."""
    if concurrency is None and rate is None:
        fail("nothing to set: give --concurrency N and/or --rate N/SECONDS (none clears one)",
             Exit.USAGE)
    kw: dict[str, Any] = {}
    if concurrency is not None:
        kw["concurrency"] = _parsed(_count, concurrency, "--concurrency", 1)
    if rate is not None:
        kw["rate"] = _parsed(_rate, rate)
    _apply(url, prefix, lambda db: SP.set_policy(db, **kw))


@group_app.command("set")
def group_set(
    name: Annotated[str, typer.Argument(
        metavar="NAME", help='The group; "*" is the default row of every group without one.')],
    weight: Annotated[str | None, typer.Option(
        "--weight", metavar="W", help=f"Its fair-share weight (>= 1); {Clearable}.")] = None,
    cap: Annotated[str | None, typer.Option(
        "--cap", metavar="N", help=f"At most N of its jobs run at once; {Clearable}.")] = None,
    rate: Annotated[str | None, typer.Option(
        "--rate", metavar="N/SECONDS", help=f"At most N starts per SECONDS; {Clearable}.")
    ] = None,
    url: Url = DEFAULT_URL,
    prefix: Prefix = DEFAULT_PREFIX,
) -> None:
    """Set a group's weight, cap and/or rate; an option left out is left as it is."""
    if weight is None and cap is None and rate is None:
        fail("nothing to set: give --weight, --cap and/or --rate (none clears one)",
             Exit.USAGE)
    kw: dict[str, Any] = {}
    if weight is not None:
        kw["weight"] = _parsed(_count, weight, "--weight", 1)
        if name == SP.DEFAULT_ROW and kw["weight"] is not None:
            fail('the "*" row has no weight (a group without one weighs the largest weight '
                 "among its jobs)", Exit.USAGE)
    if cap is not None:
        kw["cap"] = _parsed(_count, cap, "--cap", 0)
    if rate is not None:
        kw["rate"] = _parsed(_rate, rate)
    _apply(url, prefix, lambda db: SP.set_group(db, name, **kw))


GroupOpt = Annotated[str | None, typer.Option("--group", metavar="G", help="Only this group.")]
TypeOpt = Annotated[str | None, typer.Option("--type", metavar="T", help="Only this job type.")]


def _target(group: str | None, type_: str | None) -> dict[str, str | None]:
    if group is not None and type_ is not None:
        fail("give --group or --type, not both (neither: the whole queue)", Exit.USAGE)
    return {"group": group, "type": type_}


@app.command()
def pause(group: GroupOpt = None, type_: TypeOpt = None, url: Url = DEFAULT_URL,
          prefix: Prefix = DEFAULT_PREFIX) -> None:
    """Start no job of a group, of a type, or (no option) of the whole queue, until
    resume; running jobs finish. Every worker sees it within its poll interval."""
    kw = _target(group, type_)
    _apply(url, prefix, lambda db: SP.pause(db, **kw))


@app.command()
def resume(group: GroupOpt = None, type_: TypeOpt = None, url: Url = DEFAULT_URL,
           prefix: Prefix = DEFAULT_PREFIX) -> None:
    """Undo pause, with the same option."""
    kw = _target(group, type_)
    _apply(url, prefix, lambda db: SP.resume(db, **kw))

"""How the commands look: Rich tables, panels and trees built from ``aiojobqueue.admin``
data. Pure functions of plain data (no database, no printing), so new commands reuse them
and tests call them directly."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rich import box
from rich.console import RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from .. import admin
from ..attempts import attempts_short, attempts_text
from ..demo import STATE_STYLE
from ..explain import Explanation
from ..models import Job
from .runtime import safe_url

STATUS_COLUMNS = ("running", "leased", "ready", "scheduled", "waiting", "done", "failed",
                  "cancelled")
#: ... of which ``status`` shows these even where no job is in them
ALWAYS_SHOWN = ("running", "ready", "failed")


# -- small pieces -----------------------------------------------------------------------------
def styled(state: str) -> Text:
    """A state name in its colour."""
    return Text(state, style=STATE_STYLE.get(state, ""))


def count(n: int, state: str) -> Text:
    """A count in its state's colour, dimmed when zero."""
    return Text(str(n), style=STATE_STYLE.get(state, "") if n else "dim")


def ago(seconds: float | None) -> str:
    """A duration, short: ``4.2s``, ``42s``, ``59m39s``, ``3h07m``, ``2d04h`` (sign dropped)."""
    if seconds is None:
        return "-"
    seconds = abs(seconds)
    s = int(seconds)
    if s < 120:
        return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.1f}s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 172800:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def when(t: datetime | None, now: datetime | None = None) -> str:
    """A UTC time, and with ``now`` how far it is: ``(3m02s ago)`` or ``(in 59m39s)``."""
    if t is None:
        return "-"
    text = t.strftime("%Y-%m-%d %H:%M:%S")
    if now is not None:
        delta = (now - t).total_seconds()
        text += f" ({ago(delta)} ago)" if delta >= 0 else f" (in {ago(delta)})"
    return text


def ids(values: tuple[int, ...], n: int = 4) -> str:
    """At most ``n`` ids, then how many more."""
    text = ", ".join(str(i) for i in values[:n])
    return text + (f", … (+{len(values) - n})" if len(values) > n else "")


def error_text(j: Job) -> str:
    """``Type: message`` of a job's last error (empty when it has none)."""
    if not j.error:
        return ""
    return f"{j.error.get('type', '')}: {j.error.get('message', '')}"[:120]


def short(value: Any, n: int = 200) -> str:
    """JSON of ``value``, cut to ``n`` characters."""
    text = json.dumps(value, default=str)
    return text if len(text) <= n else text[: n - 1] + "…"


# -- status -----------------------------------------------------------------------------------
def status_view(st: admin.Status, url: str, notes: Sequence[str] = (),
                width: int = 80) -> list[RenderableType]:
    """``aiojobqueue status``: counts per group and state, what holds runnable work
    (``notes``: types no live worker serves, groups at their cap), then the live workers;
    laid out for a terminal ``width`` columns wide."""
    # Fits an 80-column terminal: states no job is in are left out (running, ready and
    # failed always show), columns one space apart (the box's divider, no padding); a
    # long group name is cut with an ellipsis rather than wrapped
    shown = [c for c in STATUS_COLUMNS if c in ALWAYS_SHOWN or st.totals.get(c)]
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 0), show_edge=False)
    room = width - sum(len(c) + 1 for c in (*shown, "oldest"))  # what the counts leave
    t.add_column("group", min_width=5, max_width=max(5, min(room, 40)), no_wrap=True,
                 overflow="ellipsis")
    for c in (*shown, "oldest"):  # never narrower than its heading: the group yields
        t.add_column(c, justify="right", no_wrap=True, min_width=len(c))
    for g in st.groups:
        t.add_row(escape(g.group), *(count(g.count(c), c) for c in shown),
                  ago(g.oldest_ready_age))
    if len(st.groups) > 1:
        t.add_section()
        t.add_row("[bold]all[/]", *(count(st.totals.get(c, 0), c) for c in shown),
                  ago(st.oldest_ready_age))
    if not st.groups:
        t.add_row("[dim]no jobs[/]", *("" for _ in shown), "")
    # the title above the table, not in it: a narrow table would wrap a long URL
    parts: list[RenderableType] = [Text.assemble(("aiojobqueue at ", "bold"), safe_url(url)), t]
    if st.containers:
        parts.append("containers: " + ", ".join(
            f"{n} {s}" for s, n in sorted(st.containers.items())))
    if st.releasing:
        parts.append(f"{st.releasing} part(s) of split releases pending: waiting jobs whose "
                     "upstream is done, released by any worker (a worker's sweep if theirs died)")
    parts += [Text(f"! {n}", style="yellow") for n in notes]
    # running and leased: the worker's rows in those states, read with the counts above
    w = Table(title=f"workers seen in the last {st.recent:g}s", header_style="bold",
              title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 0), show_edge=False)
    for c in ("worker", "host", "pid", "running", "leased", "seen", "up since"):
        left = c in ("worker", "host", "up since")
        w.add_column(c, justify="left" if left else "right", no_wrap=True,
                     overflow="ellipsis", max_width=16 if c == "host" else None,
                     min_width=5 if c == "host" else len(c))
    for wk in st.workers:
        w.add_row(wk.id, escape(wk.host), str(wk.pid), str(wk.running), str(wk.leased),
                  f"{ago(wk.seen_ago)} ago", when(wk.started_at))
    if not st.workers:
        w.add_row("[dim]none[/]", "", "", "", "", "", "")
    parts.append(w)
    if st.stale_workers:
        parts.append(f"[dim]{st.stale_workers} registered worker(s) not seen for more than "
                     f"{st.recent:g}s (stopped or dead; `aiojobqueue prune` removes old ones)[/]")
    return parts


# -- jobs -------------------------------------------------------------------------------------
def jobs_table(found: list[Job], now: datetime) -> RenderableType:
    """``aiojobqueue jobs``: one row per job, newest first."""
    if not found:
        return Text("no jobs match", style="dim")
    t = Table(header_style="bold", box=box.SIMPLE_HEAD, collapse_padding=True)
    for c in ("id", "type", "state", "group", "attempt", "parent", "depends on", "age", "error"):
        t.add_column(c, justify="right" if c in ("id", "attempt", "parent", "age") else "left",
                     overflow="fold" if c == "error" else "ellipsis")
    for j in found:
        t.add_row(
            str(j.id), escape(j.type) + (" [dim](container)[/]" if j.is_container else ""),
            styled(str(j.state)), escape(j.group),
            "" if j.is_container else attempts_short(j),
            str(j.parent_id or ""),
            ids(j.depends_on) if len(j.depends_on) <= 3 else f"{len(j.depends_on)} jobs",
            ago((now - j.created_at).total_seconds()), escape(error_text(j)),
        )
    return t


# -- one job ----------------------------------------------------------------------------------
def label(j: Job, me: bool = False) -> Text:
    """One node of the DAG tree: id, type, state, attempt, group, error."""
    t = Text()
    t.append(f"#{j.id} ", style="bold" if me else "")
    t.append(j.type, style="bold underline" if me else "bold")
    t.append(" (container)" if j.is_container else "", style="dim")
    t.append("  ")
    t.append_text(styled(str(j.state)))
    if not j.is_container and j.attempts:
        t.append(f"  attempt {attempts_short(j)}", style="dim")
    if j.group != "default":
        t.append(f"  [{j.group}]", style="dim")
    if j.error and j.state in ("failed", "cancelled", "scheduled"):
        t.append(f"  {error_text(j)}", style="red" if j.state == "failed" else "magenta")
    return t


def job_panel(j: Job, now: datetime) -> RenderableType:
    """The job's own fields, times relative to the database clock ``now``."""
    info = Table.grid(padding=(0, 2))
    info.add_column(style="bold")
    info.add_column()
    info.add_row("state", styled(str(j.state)))
    info.add_row("kind", "container" if j.is_container else "job")
    info.add_row("group", f"{escape(j.group)} (weight {j.weight}, priority {j.priority})")
    if not j.is_container:
        info.add_row("attempts", attempts_text(j, j.failures))
        info.add_row("args", escape(short(j.args)))
    if j.key:
        info.add_row("key", escape(j.key))
    info.add_row("created", when(j.created_at, now))
    if j.run_after and j.state in ("scheduled", "waiting"):
        info.add_row("run after", when(j.run_after, now))
    if j.started_at:
        info.add_row("started", when(j.started_at, now))
    if j.finished_at:
        info.add_row("finished", when(j.finished_at, now))
    if j.lease_owner:
        info.add_row("leased by", j.lease_owner)
    if j.result is not None:
        info.add_row("result", escape(short(j.result)))
    if j.error:
        info.add_row("error", Text(error_text(j), style="red"))
    return Panel(info, title=f"job #{j.id} · {escape(j.type)}", title_align="left",
                 border_style="blue")


def dag_tree(g: admin.JobGraph) -> RenderableType:
    """The container chain down to the job, then its dependencies, children, dependents."""
    j = g.job
    root = Tree(Text("DAG", style="bold"), guide_style="dim")
    node = root
    for a in g.ancestors:
        node = node.add(label(a))
    me = node.add(label(j, me=True))
    if g.dependencies:
        ups = me.add(Text(f"depends on ({len(g.dependencies)})", style="bold cyan"))
        for d in g.dependencies:
            ups.add(label(d))
    if g.children_total:
        states = ", ".join(f"{n} {s}" for s, n in sorted(g.children_states.items()))
        kids = me.add(Text(f"children ({g.children_total}: {states})", style="bold cyan"))
        for c in g.children:
            kids.add(label(c))
        if g.children_total > len(g.children):
            kids.add(Text(f"… {g.children_total - len(g.children)} more "
                          f"(aiojobqueue jobs --parent {j.id})", style="dim"))
    if g.dependents_total:
        downs = me.add(Text(f"needed by ({g.dependents_total})", style="bold cyan"))
        for d in g.dependents:
            downs.add(label(d))
        if g.dependents_total > len(g.dependents):
            downs.add(Text(f"… {g.dependents_total - len(g.dependents)} more", style="dim"))
    return root


# -- explain ----------------------------------------------------------------------------------
def explain_view(e: Explanation) -> RenderableType:
    """``aiojobqueue explain``: the job in one line, then each reason with its code."""
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold cyan", no_wrap=True)
    t.add_column()
    for r in e.reasons:
        t.add_row(r.code, escape(r.detail))
    head = Text.assemble((f"job #{e.job_id} ", "bold"), (e.type, "bold"),
                         f"  group {e.group}  ", styled(e.state.value))
    return Panel(t, title=head, title_align="left", border_style="blue")


def job_view(g: admin.JobGraph, now: datetime, *, traceback: bool = False
             ) -> list[RenderableType]:
    """``aiojobqueue show``: the job's panel, its DAG, and with ``traceback`` the traceback
    of every failed attempt it kept (``Job.errors``, oldest first), then the current error's
    where it is not one of them (a cancellation)."""
    parts = [job_panel(g.job, now), dag_tree(g)]
    if traceback:
        parts += tracebacks(g.job)
    return parts


def tracebacks(j: Job) -> list[RenderableType]:
    """One panel per failed attempt in ``j.errors``, and the current error's if apart."""
    parts: list[RenderableType] = []
    if j.errors_omitted:
        parts.append(Text(f"{j.errors_omitted} earlier failed attempt(s) not kept",
                          style="dim"))
    for e in j.errors:
        msg = str(e.get("message") or "")
        msg = msg if len(msg) <= 60 else msg[:59] + "…"
        head = f"traceback of attempt {e.get('attempt')} · {e.get('type')}: {msg}"
        at = str(e.get("at") or "")[:19].replace("T", " ")
        parts.append(Panel(escape((e.get("traceback") or "(no traceback)").rstrip()),
                           title=escape(head), subtitle=escape(f"{at} UTC · {e.get('worker')}"),
                           title_align="left", border_style="red"))
    tb = j.error.get("traceback") if j.error else None
    if tb and not any(e.get("traceback") == tb for e in j.errors):
        parts.append(Panel(escape(tb.rstrip()), title="traceback", border_style="red"))
    if not parts:
        parts.append(Text("no failed attempt", style="dim"))
    return parts

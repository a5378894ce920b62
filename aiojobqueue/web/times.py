"""Times in the reader's words on the dashboard: "2 min ago", "in 3 s", with the exact time
in a ``<time datetime>`` element that the page's script titles in the reader's local time
(``app.js``), so hovering shows it. The server's clock is the database's (``now``). Also the
templates' filters ``dur``, ``ago`` and ``when`` (durations and times in a table cell)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from markupsafe import Markup, escape

#: An ISO 8601 time as the queue writes it in texts and JSON (explain, the errors history).
ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:\d\d|Z)?"
#: In explain's sentences: "at <ISO> (in 3.3s)", said here as "in 3 s" alone.
SAID = re.compile(rf"(?:at )?(?P<iso>{ISO})(?: \(in [\d.]+ ?s\))?")


def words(seconds: float) -> str:
    """A duration as people say it: 40 s, 2 min, 3 h, 5 days."""
    s = abs(seconds)
    if s < 60:
        return f"{s:.0f} s"
    if s < 90 * 60:
        return f"{s / 60:.0f} min"
    if s < 36 * 3600:
        return f"{s / 3600:.0f} h"
    return f"{s / 86400:.0f} days"


def _aware(t: datetime) -> datetime:
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def rel(t: datetime | str | None, now: datetime) -> Markup:
    """``t`` relative to ``now`` ("2 min ago", "in 5 s", "just now"), in a ``<time>``."""
    if t is None or t == "":
        return Markup("—")
    when = _aware(datetime.fromisoformat(t) if isinstance(t, str) else t)
    d = (_aware(now) - when).total_seconds()
    said = "just now" if abs(d) < 1 else f"{words(d)} ago" if d > 0 else f"in {words(d)}"
    utc = when.astimezone(UTC)
    return Markup('<time datetime="{0}" title="{1}">{2}</time>').format(
        utc.isoformat(timespec="seconds"), utc.strftime("%Y-%m-%d %H:%M:%S UTC"), said)


def times(text: str, now: datetime) -> Markup:
    """``text`` (escaped) with each ISO time in it said relative to ``now``."""
    out, last = [], 0
    for m in SAID.finditer(text):
        out.append(escape(text[last:m.start()]))
        try:
            out.append(rel(m["iso"], now))
        except ValueError:
            out.append(escape(m.group(0)))
        last = m.end()
    out.append(escape(text[last:]))
    return Markup("").join(out)


def dur(seconds: float | None) -> str:
    """A duration as the pages show it: ``850 ms``, ``42 s``, ``3m 05s``, ``2h 10m``, ``4d 3h``
    (``—`` for none)."""
    if seconds is None:
        return "—"
    s = abs(float(seconds))
    if s < 1:
        out = f"{s * 1000:.0f} ms"
    elif s < 60:
        out = f"{s:.0f} s"
    elif s < 3600:
        out = f"{int(s // 60)}m {int(s % 60):02d}s"
    elif s < 86400:
        out = f"{int(s // 3600)}h {int(s % 3600 // 60):02d}m"
    else:
        out = f"{int(s // 86400)}d {int(s % 86400 // 3600)}h"
    return ("-" if seconds < 0 else "") + out


def ago(t: datetime | None, now: datetime) -> str:
    """``t`` against ``now``: ``3m 05s ago`` or ``in 42 s``."""
    if t is None:
        return "—"
    d = (now - t).total_seconds()
    return f"{dur(d)} ago" if d >= 0 else f"in {dur(-d)}"


def when(t: datetime | None) -> Markup:
    """``t`` as a ``<time>`` element in UTC."""
    if t is None:
        return Markup("—")
    iso = t.isoformat(timespec="seconds")
    return Markup('<time datetime="{0}">{1}</time>').format(
        iso, t.strftime("%Y-%m-%d %H:%M:%S") + " UTC")

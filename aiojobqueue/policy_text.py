"""The stored policy as people write and read it: the command line's and the dashboard's
``N/SECONDS``, ``none`` and counts, and the policy as plain JSON-ready data.

Parsing raises ``ConfigurationError`` (a ``ValueError``) with a sentence that names the
field and what it accepts, before anything is written; the writers of ``stored_policy``
check again what reaches them.
"""

from __future__ import annotations

import math
import re
from typing import Any

from .errors import ConfigurationError
from .limits import RateLimit
from .stored_policy import DEFAULT_ROW, GROUP, TYPE, GroupPolicy, Policy

#: the words that clear a value (an empty field does too)
CLEAR = ("none", "off", "-", "")
#: ``10/60``, ``10/60s``, ``10/1.5m``, ``10/1h``: starts per a window of time
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?|\.\d+)\s*([smh]?)\s*$")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_count(text: str, what: str, least: int) -> int | None:
    """An int ``>= least`` or, for ``none`` (or empty), None. Raises ConfigurationError."""
    t = text.strip().lower()
    if t in CLEAR:
        return None
    if not re.fullmatch(r"\d+", t) or int(t) < least:
        raise ConfigurationError(
            f"{what} must be a whole number >= {least}, or none to clear it; got {text!r}")
    return int(t)


def parse_rate(text: str) -> RateLimit | None:
    """``N/SECONDS`` (``10/60``, ``10/60s``, ``10/1m``, ``100/1h``) as a RateLimit, or None
    for ``none`` (or empty). Raises ConfigurationError."""
    t = text.strip().lower()
    if t in CLEAR:
        return None
    m = _RATE.match(t)
    per = float(m.group(2)) * _UNIT[m.group(3)] if m else 0.0
    if m is None or int(m.group(1)) < 1 or not math.isfinite(per) or per <= 0:
        raise ConfigurationError(
            f"rate must be N/SECONDS with N >= 1 and SECONDS > 0 (10/60: ten starts a "
            f"minute; also 10/1m, 100/1h), or none to clear it; got {text!r}")
    return RateLimit(int(m.group(1)), per)


def rate_text(rate: RateLimit | None) -> str:
    """A rate as it is written back: ``10/60s``; ``-`` for none."""
    return "-" if rate is None else f"{rate.n}/{rate.per:g}s"


def rate_words(rate: RateLimit | None) -> str:
    """A rate in words: ``10 starts per 60 s``; ``no rate`` for none."""
    return "no rate" if rate is None else f"{rate.n} starts per {rate.per:g} s"


def rate_data(rate: RateLimit | None) -> dict[str, Any] | None:
    """A rate as JSON: ``{"n": 10, "per": 60.0}``, or None."""
    return None if rate is None else {"n": rate.n, "per": rate.per}


def group_data(g: GroupPolicy) -> dict[str, Any]:
    """One group row as JSON."""
    return {"weight": g.weight, "cap": g.cap, "rate": rate_data(g.rate), "paused": g.paused}


def policy_data(p: Policy) -> dict[str, Any]:
    """The stored policy as JSON: the command line's ``policy --json`` and the dashboard's
    ``/api/policy`` give the same object."""
    return {
        "concurrency": p.concurrency,
        "rate": rate_data(p.rate),
        "paused": p.queue_paused,
        "default": {"cap": p.default.cap, "rate": rate_data(p.default.rate)},
        "groups": {name: group_data(g) for name, g in sorted(p.groups.items())},
        "paused_groups": paused_names(p, GROUP),
        "paused_types": paused_names(p, TYPE),
    }


def paused_names(p: Policy, scope: str) -> list[str]:
    """The paused groups or types (``scope``), sorted."""
    return sorted(name for s, name in p.paused if s == scope)


def effective(p: Policy, group: str) -> tuple[GroupPolicy, bool, bool]:
    """What applies to ``group`` (``Policy.group``), and whether its cap and its rate come
    from the ``"*"`` row rather than its own."""
    own = p.groups.get(group)
    got = p.group(group)
    from_default_cap = got.cap is not None and (own is None or own.cap is None)
    from_default_rate = got.rate is not None and (own is None or own.rate is None)
    return got, from_default_cap, from_default_rate


__all__ = ["CLEAR", "DEFAULT_ROW", "effective", "group_data", "parse_count", "parse_rate",
           "paused_names", "policy_data", "rate_data", "rate_text", "rate_words"]

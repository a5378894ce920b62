"""The overview's view of the stored policy: the policy rows (read in the overview's own
transaction), the cap and rate gauges, and each group's weight, cap, rate, pause and
fair-share target as the claim applies them.

Everything here comes from the database, never from the settings of the process serving
the page: a standalone dashboard (``aiojobqueue dashboard --url``) shows what a mounted
one shows. Only code stays per process: a custom ``Limit`` and a ``RateLimit`` with a
name of its own are shown as this process's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from .. import schema as S
from ..limits import Limit, RateLimit
from ..live_policy import QUEUE_RATE_NAME, ledger_name
from ..policy import GroupDemand, fair_share
from ..policy_text import rate_data, rate_text, rate_words
from ..stored_policy import Policy, policy_from_rows
from .reader import min_cap
from .views import Count, Gauge


async def read_policy(conn: AsyncConnection, t: S.Tables) -> Policy:
    """The stored policy, in the caller's transaction (one read of a small table)."""
    P = t.policy
    rows = (await conn.execute(select(
        P.c.scope, P.c.name, P.c.weight, P.c.cap, P.c.rate_n, P.c.rate_per, P.c.paused))).all()
    return policy_from_rows(list(rows))


async def gauges(conn: AsyncConnection, t: S.Tables, p: Policy, running: int,
                 limits: Iterable[Limit]) -> list[Gauge]:
    """The global cap against what runs, the queue's rate against its window, then this
    process's own limits (code: not in the policy)."""
    if p.concurrency is not None:
        out = [Gauge("global cap", running, p.concurrency,
                     "stored policy: every worker holds it")]
    else:
        out = [Gauge("running", running, None,
                     "no global cap is set (none in the stored policy)")]
    if p.rate is not None:
        used = await RateLimit(p.rate.n, p.rate.per, name=QUEUE_RATE_NAME).used(conn, t)
        out.append(Gauge("rate", used, p.rate.n, f"starts in the last {p.rate.per:g} s"))
    for lim in limits:
        if isinstance(lim, RateLimit):
            if lim.name == QUEUE_RATE_NAME:  # the queue's rate: stored, shown above
                continue
            used = await lim.used(conn, t)
            out.append(Gauge(f"rate {lim.name}", used, lim.n,
                             f"starts in the last {lim.per:g} s (this process's code)"))
        else:
            out.append(Gauge(type(lim).__name__, 0, None, "a custom limit (in-process)"))
    return out


async def group_rate_used(conn: AsyncConnection, t: S.Tables, p: Policy,
                          groups: Iterable[str]) -> dict[str, int]:
    """Starts counted against each rated group's window now (its ledger rows)."""
    out = {}
    for g in groups:
        r = p.group(g).rate
        if r is not None:
            out[g] = await RateLimit(r.n, r.per, name=ledger_name(g)).used(conn, t)
    return out


def targets(p: Policy, weights: dict[str, int], per: dict[str, dict[str, Count]],
            shown: list[str]) -> dict[str, int] | None:
    """Each group's share of the global cap by weight, as the claim splits the slots among
    groups with work (capped by demand and group cap; a paused group takes none). None
    where no global cap is set or the queue is paused: a target then means nothing."""
    if p.concurrency is None or p.queue_paused:
        return None
    demand = {}
    for g in shown:
        want = per[g][S.READY].n + per[g][S.RUNNING].n
        gp = p.group(g)
        if want and not gp.paused:
            demand[g] = GroupDemand(weights[g], 0, min_cap(gp.cap, want))
    got = fair_share(p.concurrency, demand)
    return {g: got.get(g, 0) for g in shown}


def row_policy(p: Policy, g: str, used: dict[str, int]) -> dict[str, Any]:
    """What the groups table shows of ``g``'s policy: its own values (the forms' values),
    what applies (own, else the ``"*"`` row's) and the rate's use."""
    own = p.groups.get(g)
    eff = p.group(g)
    return {
        "own_weight": own.weight if own else None,
        "own_cap": own.cap if own else None,
        "own_rate": rate_text(own.rate) if own and own.rate else "",
        "cap": eff.cap, "rate": rate_data(eff.rate), "rate_text": rate_text(eff.rate),
        "paused": eff.paused,
        "cap_default": eff.cap is not None and (own is None or own.cap is None),
        "rate_default": eff.rate is not None and (own is None or own.rate is None),
        "rate_used": used.get(g), "rate_words": rate_words(eff.rate),
    }

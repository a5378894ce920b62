"""What the stored policy holds a runnable job with, for ``explain()``: a pause (the whole
queue, its group or its type), the global cap, its group's cap (its own row's, else the
``"*"`` row's) and the rates the policy stores (the queue's, its group's).

Read from the policy table in explain's own read transaction, so the answer is what every
worker follows now, wherever explain runs (a command line or a dashboard with no settings
of its own included). A reason is a ``(code, detail, data)`` triple that explain.py makes a
``Reason`` of (this module imports nothing of explain's: no import cycle).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .limits import RateLimit
from .live_policy import QUEUE_RATE_NAME, ledger_name
from .sql import lit
from .stored_policy import GROUP, QUEUE, TYPE, Policy, read_policy_on

if TYPE_CHECKING:
    from .database import Database

#: (code, detail, data): a ``Reason``'s fields
Held = tuple[str, str, dict[str, Any]]

def paused_reasons(p: Policy, row: Any) -> list[Held]:
    """One ``paused`` reason per pause that holds the job (data: scope, name)."""
    out: list[Held] = []
    held = [(QUEUE, "", "The whole queue is paused"),
            (GROUP, row.group_key, f"Group {row.group_key!r} is paused"),
            (TYPE, row.type, f"Type {row.type!r} is paused")]
    for scope, name, text in held:
        if (scope, name) in p.paused:
            how = "resume()" if scope == QUEUE else f"resume({scope}={name!r})"
            out.append(("paused", f"{text}: none of its jobs starts until {how}; "
                              "running jobs finish.", {"scope": scope, "name": name}))
    return out


async def cap_reasons(db: Database, conn: AsyncConnection, p: Policy,
                      row: Any) -> list[Held]:
    """``global_cap`` and ``group_cap`` where the stored caps are reached."""
    J = db.t.jobs
    running = J.c.state == lit(S.RUNNING)
    out: list[Held] = []
    if p.concurrency is not None:
        n = int((await conn.execute(select(func.count()).select_from(J).where(running)))
                .scalar_one())
        if n >= p.concurrency:
            out.append((
                "global_cap",
                f"The global cap is full: {n} of {p.concurrency} jobs are running.",
                {"cap": p.concurrency, "running": n}))
    own = p.groups.get(row.group_key)
    cap = p.group(row.group_key).cap
    if cap is not None:
        n = int((await conn.execute(select(func.count()).select_from(J).where(
            running, J.c.group_key == row.group_key))).scalar_one())
        if n >= cap:
            whose = "its cap" if own is not None and own.cap is not None else \
                'the cap of the "*" row (it has no cap of its own)'
            out.append((
                "group_cap",
                f"Group {row.group_key!r} is at {whose}: {n} of {cap} jobs are running.",
                {"group": row.group_key, "cap": cap, "running": n}))
    return out


def stored_rates(p: Policy, group: str) -> list[RateLimit]:
    """The stored rates that count this group's starts, named as the claim's ledger."""
    out = []
    if p.rate is not None:
        out.append(RateLimit(p.rate.n, p.rate.per, name=QUEUE_RATE_NAME))
    r = p.group(group).rate
    if r is not None:
        out.append(RateLimit(r.n, r.per, name=ledger_name(group)))
    return out


async def policy_holds(db: Database, conn: AsyncConnection,
                       row: Any) -> tuple[list[Held], list[RateLimit]]:
    """What the stored policy says of ``row``: the pause and cap reasons, and the rates to
    check (explain's rate loop reports those used up)."""
    p = await read_policy_on(db, conn)
    reasons = paused_reasons(p, row) + await cap_reasons(db, conn, p, row)
    return reasons, stored_rates(p, row.group_key)

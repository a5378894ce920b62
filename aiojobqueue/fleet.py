"""The fleet as the database knows it: what each live worker registers with its heartbeat
(its job types, capacity and the caps it enforces: ``registration``), the caps that hold
all of them together (``fleet_caps``, read by ``explain``), and what ``status`` flags from
it: runnable types that no live worker serves, and groups held at their cap. A worker is
live while its last heartbeat is younger than the reading queue's ``lease_ttl``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .limits import RateLimit
from .live_policy import QUEUE_RATE_NAME
from .settings import Settings
from .sql import lit
from .stored_policy import read_policy_on
from .timeutil import db_now, utcnow_plus

if TYPE_CHECKING:
    from .database import Database
    from .queue import JobQueue


@dataclass(frozen=True)
class GroupAtCap:
    """A group with runnable jobs whose cap is reached (for ``status``)."""

    group: str
    cap: int
    running: int
    ready: int


def registration(settings: Settings, handlers: Iterable[str]) -> dict[str, Any]:
    """What a worker writes to its registry row with each heartbeat: the job types it has
    handlers for, its capacity, and the caps it enforces."""
    return {
        "types": sorted(handlers),
        "capacity": settings.capacity,
        "config": {
            "concurrency": settings.concurrency,
            "group_limits": dict(settings.group_limits),
            "rate_limits": [{"name": r.name, "n": r.n, "per": r.per}
                            for r in settings.db_limits],
        },
    }


@dataclass
class FleetCaps:
    """The live workers and the caps that hold (this queue's and theirs)."""

    workers: list[Any]
    concurrency: int | None
    group_limits: dict[str, int]
    rate_limits: list[RateLimit]
    #: the stored ``"*"`` row's cap: every group not in ``group_limits`` (None: no cap)
    default_cap: int | None = None

    def cap(self, group: str) -> int | None:
        """The cap that holds ``group``: its own, else the ``"*"`` row's."""
        return self.group_limits.get(group, self.default_cap)

    def serving(self, job_type: str) -> list[Any]:
        """Live workers that serve ``job_type`` (one registered before v6 might)."""
        return [w for w in self.workers if w.types is None or job_type in w.types]


async def fleet_caps(s: Settings, db: Database, conn: AsyncConnection) -> FleetCaps:
    W = db.t.workers
    rows = (await conn.execute(
        select(W.c.id, W.c.types, W.c.capacity, W.c.running, W.c.config)
        .where(W.c.last_seen >= utcnow_plus(-s.lease_ttl)).order_by(W.c.id))).all()
    # The caps in force are the stored policy's (every worker enforces it, whatever it
    # declared); RateLimits of other names stay per process, as each worker registered them
    p = await read_policy_on(db, conn)
    # (a paused group is explain's ``paused``, not a cap)
    groups = {g: gp.cap for g, gp in p.groups.items() if gp.cap is not None}
    rates = {QUEUE_RATE_NAME: p.rate} if p.rate is not None else {}
    for r in s.db_limits:
        if r.name != QUEUE_RATE_NAME:
            rates.setdefault(r.name, r)
    for w in rows:
        cfg = w.config if isinstance(w.config, dict) else {}
        for r in cfg.get("rate_limits") or ():
            if r.get("name") not in rates and r.get("name") != QUEUE_RATE_NAME:
                rates[r["name"]] = RateLimit(int(r["n"]), float(r["per"]), name=r["name"])
    return FleetCaps(list(rows), p.concurrency, groups, list(rates.values()), p.default.cap)


async def unserved_types(queue: JobQueue) -> dict[str, int]:
    """Job types with runnable jobs that no live worker serves: ``{type: runnable count}``."""
    core = queue._started()
    s, db = core.settings, core.db
    J = db.t.jobs

    async def read(conn: AsyncConnection) -> dict[str, int]:
        fleet = await fleet_caps(s, db, conn)
        runnable = or_(J.c.state == lit(S.READY),
                       and_(J.c.state == lit(S.SCHEDULED), J.c.run_after <= db_now()))
        rows = (await conn.execute(select(J.c.type, func.count()).where(runnable)
                                   .group_by(J.c.type))).all()
        return {t: int(n) for t, n in sorted(rows) if not fleet.serving(t)}

    return await db.read(read)


async def groups_at_cap(queue: JobQueue) -> list[GroupAtCap]:
    """Groups with ready jobs whose cap (this queue's or a live worker's) is reached."""
    core = queue._started()
    s, db = core.settings, core.db
    J = db.t.jobs

    async def read(conn: AsyncConnection) -> list[GroupAtCap]:
        fleet = await fleet_caps(s, db, conn)
        out = []
        caps = dict(fleet.group_limits)
        if fleet.default_cap is not None:  # every group with ready jobs has that cap
            ready_groups = await conn.execute(select(J.c.group_key).where(
                J.c.state == lit(S.READY)).distinct())
            for (g,) in ready_groups:
                caps.setdefault(g, fleet.default_cap)
        for g, cap in sorted(caps.items()):
            running = await _count(conn, select(func.count()).select_from(J).where(
                J.c.state == lit(S.RUNNING), J.c.group_key == g))
            if running < cap:
                continue
            ready = await _count(conn, select(func.count()).select_from(J).where(
                J.c.state == lit(S.READY), J.c.group_key == g))
            if ready:
                out.append(GroupAtCap(g, cap, running, ready))
        return out

    return await db.read(read)


async def notes(queue: JobQueue) -> list[str]:
    """What ``status`` flags, one sentence each: runnable types that no live worker serves,
    and groups with ready jobs held at their cap."""
    return notes_of(await unserved_types(queue), await groups_at_cap(queue))


def notes_of(unserved: dict[str, int], at_cap: Iterable[GroupAtCap]) -> list[str]:
    """``notes()`` from what ``unserved_types`` and ``groups_at_cap`` returned."""
    out = [f"type {t!r}: {n} runnable job(s) and no live worker serves it"
           for t, n in unserved.items()]
    out += [f"group {g.group!r} is at its cap: {g.running} of {g.cap} running, {g.ready} ready"
            for g in at_cap]
    return out


async def _count(conn: AsyncConnection, stmt: Any) -> int:
    return int(await conn.scalar(stmt) or 0)

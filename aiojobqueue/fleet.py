"""The fleet as the database knows it: what each live worker registers with its heartbeat
(its job types, capacity and the caps it enforces: ``registration``), the caps that hold
all of them together (``fleet_caps``, read by ``explain``), and what ``status`` flags from
it: runnable types that no live worker serves, and groups held at their cap (the stored
policy's caps, ``stored_caps``). A worker is
live while its last heartbeat is younger than the reading queue's ``lease_ttl``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .limits import RateLimit
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

    def serving(self, job_type: str) -> list[Any]:
        """Live workers that serve ``job_type`` (one registered before v6 might)."""
        return [w for w in self.workers if w.types is None or job_type in w.types]


async def fleet_caps(s: Settings, db: Database, conn: AsyncConnection) -> FleetCaps:
    W = db.t.workers
    rows = (await conn.execute(
        select(W.c.id, W.c.types, W.c.capacity, W.c.running, W.c.config)
        .where(W.c.last_seen >= utcnow_plus(-s.lease_ttl)).order_by(W.c.id))).all()
    caps = [s.concurrency] if s.concurrency is not None else []
    groups: dict[str, int] = dict(s.group_limits)
    rates = {r.name: r for r in s.db_limits}
    for w in rows:
        cfg = w.config if isinstance(w.config, dict) else {}
        if isinstance(cfg.get("concurrency"), int):
            caps.append(cfg["concurrency"])
        for g, n in (cfg.get("group_limits") or {}).items():
            groups[g] = min(groups.get(g, n), n)
        for r in cfg.get("rate_limits") or ():
            if r.get("name") not in rates:
                rates[r["name"]] = RateLimit(int(r["n"]), float(r["per"]), name=r["name"])
    return FleetCaps(list(rows), min(caps) if caps else None, groups, list(rates.values()))


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
    """Groups with ready jobs whose cap (the stored policy's: the group's own, else the
    ``"*"`` row's) is reached."""
    core = queue._started()
    db = core.db
    J = db.t.jobs

    async def read(conn: AsyncConnection) -> list[GroupAtCap]:
        out = []
        for g, cap in sorted((await stored_caps(db, conn)).items()):
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


async def stored_caps(db: Database, conn: AsyncConnection) -> dict[str, int]:
    """The stored caps ``status`` checks: every group's own cap, and where the ``"*"`` row
    has one, the groups without their own that run at least that many (one GROUP BY of
    the running jobs)."""
    p = await read_policy_on(db, conn)
    caps = {g: gp.cap for g, gp in p.groups.items() if gp.cap is not None}
    if p.default.cap is not None:  # a group at the default cap runs that many: count those
        J = db.t.jobs
        for (g,) in await conn.execute(
                select(J.c.group_key).where(J.c.state == lit(S.RUNNING))
                .group_by(J.c.group_key).having(func.count() >= p.default.cap)):
            caps.setdefault(g, p.default.cap)
    return caps


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

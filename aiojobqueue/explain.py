"""Why a job is not running: ``queue.explain(job_id)``, and what ``status`` flags.

The answer is read from the database in one read-only transaction, through the started
queue's ``Core`` (its settings and database). Pauses, caps and the queue's and groups'
rates are the stored policy's (``explain_policy.py``): what every worker follows, wherever
explain runs. Which live workers serve a type, and the per-process rate limits (a
``RateLimit`` with a name of its own) come from the workers' registrations (see
``fleet.registration``). A custom ``Limit`` lives in its process: only this queue's own are
asked. A worker is live while its last heartbeat is younger than this queue's ``lease_ttl``.

Reason codes (``Reason.code``), in the order they are reported:

* ``terminal``   done, failed or cancelled (data: state, error, finished_at);
* ``running``    leased by a worker (data: worker, attempt, started_at, lease_expires,
                 cancel_requested, progress);
* ``external``   an external step no worker runs, waiting for ``complete()`` / ``fail()``
                 (data: since, deadline: None without a timeout; see external.py);
* ``waiting_on`` unfinished jobs it waits on, its own dependencies and its containers',
                 a container's unfinished members included (data: ids, direct); a container
                 that is active waits on its unfinished children;
* ``condition``  with ``waiting_on``: its run condition (data: when, "failed" or "finished";
                 see conditions.py);
* ``scheduled``  its ``run_after`` has not come (data: when);
* ``backoff``    a failed attempt's retry delay has not passed (data: when, attempt, error);
* ``no_worker``  no live worker serves its type (data: type, live_workers);
* ``paused``     the whole queue, its group or its type is paused, one reason each (data:
                 scope "queue", "group" or "type", name);
* ``global_cap`` the stored ``concurrency`` is reached (data: cap, running);
* ``group_cap``  its group's cap (its own row's, else the "*" row's) is reached (data:
                 group, cap, running; its detail says when the cap is the "*" row's);
* ``rate_limit`` a RateLimit is used up (data: name, n, per, next_at);
* ``limit``      one of this queue's custom Limits allows no start now (data: limit);
* ``fair_share`` slots are scarce and other groups are owed the next ones (data: group,
                 running, weight, ahead): the claim's order, the lowest
                 ``running / weight`` first and equal ratios in the rotation after the
                 last group this process served (docs/scheduling.md, "Bounded wait"; a
                 process that claimed nothing yet starts from the first name);
* ``ready``      nothing holds it: a worker should take it next (data: ahead_in_group,
                 workers_busy).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .census import group_demand_query
from .errors import JobNotFoundError
from .explain_policy import policy_holds
from .explanation import Explanation as Explanation  # aiojobqueue, jobmethods, the CLI
from .explanation import Reason as Reason
from .fleet import FleetCaps, fleet_caps
from .limits import RateLimit
from .models import JobState
from .policy import GroupDemand, rotation_key
from .settings import Settings
from .sql import lit
from .timeutil import db_now, utcnow_plus

if TYPE_CHECKING:
    from .core import Core
    from .database import Database

#: At most this many ids in a ``waiting_on`` reason (its detail says how many in all).
MAX_IDS = 100


# -- explain ----------------------------------------------------------------------------------
async def explain(core: Core, job_id: int, conn: AsyncConnection | None = None,
                  given: Any = None) -> Explanation:
    """Why ``job_id`` is not running now (``JobQueue.explain``). Raises JobNotFoundError.
    With ``conn`` and ``given`` (the job's row as the caller read it on ``conn``), it explains
    that very row: a page shows the job's state, facts and explanation of one moment."""
    s, db = core.settings, core.db
    J = db.t.jobs

    async def read(conn: AsyncConnection) -> Explanation:
        row = given or (await conn.execute(select(J).where(J.c.id == job_id))).first()
        if row is None:
            raise JobNotFoundError(f"no job with id {job_id}")
        now = (await conn.execute(select(db_now()))).scalar_one()
        state = row.state
        if state in S.TERMINAL:
            reasons = [_terminal(row)]
        elif state in S.LEASED_STATES:  # (leased: held by its worker for its next free slot)
            reasons = [_running(row, now)]
        elif state == S.EXTERNAL:
            reasons = [external_reason(row, now)]
        elif state in (S.WAITING, S.ACTIVE):
            reasons = [await _waiting_on(db, conn, row)]
            if row.kind in (S.ONFAIL, S.ALWAYS):
                reasons.append(_condition(row))
            if state == S.WAITING and row.run_after > now:
                reasons.append(_scheduled(row, now))
        elif state == S.SCHEDULED and row.run_after > now:
            reasons = [_scheduled(row, now)]
        else:  # ready, or scheduled and due (the next claim promotes it)
            reasons = await _held(s, db, conn, row, now, core.claimer.cursor)
        return Explanation(row.id, row.type, row.group_key, JobState(state), reasons)

    return await (read(conn) if conn is not None else db.read(read))


def _terminal(row: Any) -> Reason:
    err = row.error or {}
    why = f" ({err.get('type')}: {err.get('message')})" if err else ""
    return Reason("terminal", f"It has finished{why}; it will not run again unless retried.",
                  {"state": row.state, "error": row.error, "finished_at": row.finished_at})


def external_reason(row: Any, now: datetime) -> Reason:
    """An external step: who it waits for (complete/fail), since and until when."""
    since = row.started_at.isoformat(timespec="seconds") if row.started_at else "?"
    if row.lease_expires is None:
        until = "it has no timeout"
    else:
        left = (row.lease_expires - now).total_seconds()
        until = (f"it fails at {row.lease_expires.isoformat(timespec='seconds')} (in "
                 f"{left:.1f}s) unless completed" if left >= 0 else
                 f"its timeout passed {-left:.1f}s ago: the next sweep fails it")
    return Reason(
        "external",
        f"It is an external step: no worker runs it; it has waited since {since} for "
        f"complete() or fail() (queue, SyncQueue, command line or dashboard); {until}.",
        {"since": row.started_at, "deadline": row.lease_expires})


def _condition(row: Any) -> Reason:
    """Why a job with a run condition waits, and what it waits for (conditions.py)."""
    if row.kind == S.ONFAIL:
        held = row.pending % S.CREDIT >= S.HOLD
        return Reason("condition", (
            "It has when='failed': it runs once every dependency has ended and one of them "
            "failed or was cancelled" + (" (none has yet; if all end done it is cancelled)."
                                         if held else " (one has).")),
            {"when": "failed", "failed_upstream": not held})
    return Reason("condition", "It has when='finished': it runs once every dependency has "
                  "ended, whatever the outcome.", {"when": "finished"})


def _running(row: Any, now: datetime) -> Reason:
    left = (row.lease_expires - now).total_seconds() if row.lease_expires else 0.0
    lease = (f"its lease expires in {left:.1f}s" if left >= 0 else
             f"its lease expired {-left:.1f}s ago (the worker may have died: any worker "
             "reclaims it)")
    extra = "; a cancel is requested" if row.cancel_requested else ""
    return Reason(
        "running",
        f"It is running attempt {row.attempts} on worker {row.lease_owner}; {lease}{extra}.",
        {"worker": row.lease_owner, "attempt": row.attempts, "started_at": row.started_at,
         "lease_expires": row.lease_expires, "cancel_requested": bool(row.cancel_requested),
         "progress": row.progress})


def _scheduled(row: Any, now: datetime) -> Reason:
    secs = max((row.run_after - now).total_seconds(), 0.0)
    when = row.run_after.isoformat(timespec="seconds")
    if row.state == S.SCHEDULED and row.attempts > 0 and row.error is not None:
        err = row.error
        return Reason(
            "backoff",
            f"Attempt {row.attempts} failed ({err.get('type')}: {err.get('message')}); it is "
            f"retried at {when} (in {secs:.1f}s).",
            {"when": row.run_after, "attempt": row.attempts, "error": err})
    return Reason("scheduled", f"It is scheduled to run at {when} (in {secs:.1f}s).",
                  {"when": row.run_after})


async def _waiting_on(db: Database, conn: AsyncConnection, row: Any) -> Reason:
    """The unfinished jobs ``row`` waits on: its and its ancestors' dependencies (for an
    active container: its children), with the unfinished members of containers among them."""
    J, D = db.t.jobs, db.t.deps
    direct: set[int] = set()
    boxes: set[int] = set()
    if row.state == S.ACTIVE:
        boxes.add(row.id)
    else:
        node: int | None = row.id
        seen: set[int] = set()
        while node is not None and node not in seen:
            seen.add(node)
            up = (await conn.execute(
                select(J.c.id, J.c.kind).join(D, D.c.depends_on_id == J.c.id)
                # a job with a run condition waits on its unfinished ones only
                .where(D.c.job_id == node, J.c.state.in_(S.LIVE)
                       if node == row.id and row.kind in (S.ONFAIL, S.ALWAYS)
                       else J.c.state != S.DONE))).all()
            direct.update(r.id for r in up)
            boxes.update(r.id for r in up if r.kind == S.CONTAINER)
            node = (await conn.execute(select(J.c.parent_id).where(J.c.id == node))).scalar()
    members = await _unfinished_members(db, conn, boxes, MAX_IDS)
    ids = sorted(direct | set(members))
    total = len(ids)
    shown = ids[:MAX_IDS]
    if row.state == S.ACTIVE:
        text = (f"It is a container; it finishes when its {len(members)} unfinished "
                f"job(s) do: {_list(members)}.")
    elif not ids:
        text = "Its dependencies have finished; it is being released."
    else:
        inside = f" ({len(members)} inside containers)" if members else ""
        text = (f"It waits on job {ids[0]}{' (inside a container)' if members else ''}, "
                "which has not finished." if total == 1 else
                f"It waits on {total} unfinished jobs{inside}: {_list(shown)}.")
    return Reason("waiting_on", text, {"ids": shown, "direct": sorted(direct),
                                       "more": max(total - len(shown), 0)})


async def _unfinished_members(
    db: Database, conn: AsyncConnection, boxes: Iterable[int], limit: int
) -> list[int]:
    """Live descendants of the containers ``boxes`` (breadth first, at most about ``limit``)."""
    J = db.t.jobs
    out: list[int] = []
    frontier = sorted(boxes)
    seen = set(frontier)
    while frontier and len(out) < limit:
        rows = (await conn.execute(
            select(J.c.id, J.c.kind).where(J.c.parent_id.in_(frontier),
                                           J.c.state.in_(S.LIVE))
            .order_by(J.c.id).limit(limit * 2))).all()
        out += [r.id for r in rows if r.kind != S.CONTAINER]
        frontier = [r.id for r in rows if r.kind == S.CONTAINER and r.id not in seen]
        seen.update(frontier)
    return sorted(out)


def _list(ids: list[int], show: int = 10) -> str:
    head = ", ".join(str(i) for i in ids[:show])
    return head + (f" and {len(ids) - show} more" if len(ids) > show else "")


async def _count(conn: AsyncConnection, stmt: Any) -> int:
    return int((await conn.execute(stmt)).scalar_one())


async def _held(
    s: Settings, db: Database, conn: AsyncConnection, row: Any, now: datetime,
    cursor: str | None,
) -> list[Reason]:
    """What holds a runnable job: workers, caps, limits, fair share; else ``ready``.
    ``cursor``: this process's fair-share rotation point (``Claimer.cursor``)."""
    fleet = await fleet_caps(s, db, conn)
    out = await _capped(s, db, conn, row, now, fleet)
    if out:
        return out
    return await _in_line(db, conn, row, cursor, fleet.serving(row.type))


async def _capped(s: Settings, db: Database, conn: AsyncConnection, row: Any, now: datetime,
                  fleet: FleetCaps) -> list[Reason]:
    """What keeps a runnable job from starting at all: no worker serves its type, a pause,
    a cap, a rate or a local limit (the stored policy, the fleet's declared limits)."""
    out: list[Reason] = []
    serving = fleet.serving(row.type)
    if not serving:
        n = len(fleet.workers)
        out.append(Reason(
            "no_worker",
            f"No live worker serves type {row.type!r} ({n} live worker(s) serve other types).",
            {"type": row.type, "live_workers": n}))
    held, rates = await policy_holds(db, conn, row)  # pauses, caps, rates: the stored policy
    out += [Reason(*h) for h in held]
    own = [r for r in fleet.rate_limits if r.name not in {x.name for x in rates}]
    for lim in rates + own:
        if await lim.budget(conn, db.t) > 0:
            continue
        opens = await _next_rate_slot(db, conn, lim)
        secs = max((opens - now).total_seconds(), 0.0) if opens is not None else 0.0
        at = f" at {opens.isoformat(timespec='seconds')} (in {secs:.1f}s)" if opens else ""
        out.append(Reason(
            "rate_limit",
            f"Rate limit {lim.name!r} ({lim.n} per {lim.per:g}s) is used up; the next slot "
            f"opens{at}.",
            {"name": lim.name, "n": lim.n, "per": lim.per, "next_at": opens}))
    for local in s.local_limits:
        try:
            free = int(await local.available())
        except Exception as exc:  # a limit that fails allows nothing (as in the worker)
            free, note = 0, f" (it raised {exc!r})"
        else:
            note = ""
        if free <= 0:
            out.append(Reason("limit", f"The limit {local!r} allows no start now{note}.",
                              {"limit": repr(local)}))
    return out


async def _in_line(db: Database, conn: AsyncConnection, row: Any, cursor: str | None,
                   serving: list[Any]) -> list[Reason]:
    """Nothing caps the job: whether its group is owed the next slot (fair share, where every
    worker that could run it is busy), else ``ready`` with what comes first in its group."""
    J = db.t.jobs
    # the claim's own census and fair-share rule
    types = sorted({row.type} | {t for w in serving for t in (w.types or ())})
    demand = {g: GroupDemand(int(w or 1), int(r), None) for g, w, r in
              (await conn.execute(group_demand_query(db.t, types))).all()}
    room = [max(int(w.capacity) - int(w.running), 0) for w in serving if w.capacity is not None]
    busy = bool(room) and len(room) == len(serving) and sum(room) == 0
    ahead_in_group = await _count(conn, select(func.count()).select_from(
        select(J.c.id).where(
            J.c.state == lit(S.READY), J.c.group_key == row.group_key, J.c.type.in_(types),
            or_(J.c.priority > row.priority,
                and_(J.c.priority == row.priority, J.c.id < row.id)))
        .limit(10_000).subquery()))
    mine = demand.get(row.group_key)
    if busy and mine is not None and len(demand) > 1:
        # The claim's order (policy.fair_share with rotate=True): the lowest ratio first;
        # at a tie the rotation after this process's cursor, never the weight.
        turn = rotation_key(cursor)

        def key(g: str) -> tuple[float, tuple[int, str]]:
            d = demand[g]
            return (d.running / max(d.weight, 1), turn(g))

        ahead = sorted((g for g in demand if key(g) < key(row.group_key)), key=key)
        if ahead:
            return [Reason(
                "fair_share",
                f"Every worker that could run it is busy, and fair share gives the next "
                f"slots to {_names(ahead)} first (group {row.group_key!r} runs "
                f"{mine.running} at weight {mine.weight}).",
                {"group": row.group_key, "running": mine.running, "weight": mine.weight,
                 "ahead": ahead})]
    queue_note = (f" {ahead_in_group} job(s) of its group come first (priority, then age)."
                  if ahead_in_group else "")
    busy_note = " Every worker that could run it is busy; it is next in line." if busy else ""
    due = " It is due; the next claim makes it ready." if row.state == S.SCHEDULED else ""
    return [Reason(
        "ready",
        f"Nothing holds it: a worker should take it next.{due}{queue_note}{busy_note}",
        {"ahead_in_group": ahead_in_group, "workers_busy": busy})]


def _names(groups: list[str], show: int = 5) -> str:
    head = ", ".join(repr(g) for g in groups[:show])
    return "group(s) " + head + (f" and {len(groups) - show} more" if len(groups) > show else "")


async def _next_rate_slot(
    db: Database, conn: AsyncConnection, lim: RateLimit
) -> datetime | None:
    """When the next start is allowed: when the newest row of the window whose running sum
    of starts (newest first) reaches ``n`` ages out, what stays sums to ``n - 1`` at most.
    (A row is one claim, holding ``starts`` starts; see RateLimit.consume.)"""
    R = db.t.rate
    run = func.sum(R.c.starts).over(order_by=(R.c.at.desc(), R.c.id.desc()),
                                    rows=(None, 0)).label("run")
    inner = (select(R.c.at, R.c.id, run)
             .where(R.c.name == lim.name, R.c.at > utcnow_plus(-lim.per)).subquery())
    at = (await conn.execute(select(inner.c.at).where(inner.c.run >= lim.n)
                             .order_by(inner.c.at.desc(), inner.c.id.desc()).limit(1))).scalar()
    if at is None:
        return None
    return at + timedelta(seconds=lim.per)  # type: ignore[no-any-return]

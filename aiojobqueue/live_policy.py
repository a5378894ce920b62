"""This process's cache of the stored policy (stored_policy.py), and what the claim asks of
it: the global cap, each group's cap, weight and rate (its own row's, else the ``"*"``
row's), what is paused, and whether slots must be counted under the gate.

The cache is read again when it may be stale: at most once per ``poll_interval`` a
primary-key read of the version token (the rows only where it changed), at once where a
change in this process or a ``"policy"`` wake-up (PostgreSQL NOTIFY) marks it stale. So a
claim never pays a query for the policy.

A change seen here bumps ``generation``. Jobs held ahead and the hand-over (slots.py) keep
a slot's count as it was, which is only right while the count is within the caps: after a
change they stop (held jobs are given back) until ``HANDOVER_WAIT`` poll intervals have
passed (every live worker has seen the change by then) and a count of what runs found the
caps held (``Slots.checked``). See docs/scheduling.md "Changing the policy".
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from . import schema as S
from .database import Database
from .limits import RateLimit
from .settings import Settings
from .sql import lit
from .stored_policy import (
    Policy,
    read_policy,
    read_policy_on,
    read_version,
    set_group,
    set_policy,
)
from .timeutil import utcnow_plus

log = logging.getLogger("aiojobqueue.policy")

#: after a change, no hand-over nor held slot for this many poll intervals (see above)
HANDOVER_WAIT = 2.0
#: the name a declared RateLimit has where it is the queue's stored rate
QUEUE_RATE_NAME = "default"


def ledger_name(group: str) -> str:
    """A group's name in the rate ledger (whose names are at most 100 characters)."""
    name = f"group:{group}"
    return name if len(name) <= 100 else "group#" + hashlib.sha1(group.encode()).hexdigest()


class LivePolicy:
    """The policy in force as this process last read it (see the module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.version: str | None = None
        self.loaded = False  # the first refresh has read the rows
        self.stale = True  # read the token at the next refresh, whatever the timer says
        self.read_at = float("-inf")  # monotonic time of the last look at the token
        self.generation = 0  # bumped by every change applied after the first read
        self.changed_at = float("-inf")  # monotonic time the last change was applied
        # a declared RateLimit counts the stored rate it declared (its ``headroom`` then
        # tells the caller what the claims found)
        self._rates: dict[tuple[str, int, float], RateLimit] = {
            (r.name, r.n, r.per): r for r in settings.db_limits}
        self.apply(Policy())

    # -- what the claim reads ----------------------------------------------------------------
    def apply(self, p: Policy) -> None:
        """Take ``p`` as the policy in force; derive what the hot paths test."""
        self.policy = p
        self.concurrency = p.concurrency
        rate = p.rate and self._rate(QUEUE_RATE_NAME, p.rate)
        # RateLimits named otherwise stay per process (they are code, like a Limit)
        own = tuple(r for r in self.settings.db_limits if r.name != QUEUE_RATE_NAME)
        self.db_limits: tuple[RateLimit, ...] = ((rate,) if rate else ()) + own
        rows = [p.default, *p.groups.values()]
        self.has_caps = any(r.cap is not None or r.paused for r in rows)
        self.group_rates = any(r.rate is not None for r in rows)
        #: some group has a row the claim applies (cap, weight, rate, pause): every claim
        #: reads the census (no shortcut that skips the per-group split)
        self.per_group = bool(p.groups) or p.default.cap is not None or self.group_rates
        #: a count of running jobs holds a cap: finalize and claim share one transaction
        self.counts_slots = self.concurrency is not None or self.has_caps
        #: claims take the gate: a cap or a rate is counted
        self.needs_gate = self.counts_slots or bool(self.db_limits) or self.group_rates
        #: a rate (queue, group or per-process RateLimit) counts starts: no hand-over
        self.rated = bool(self.db_limits) or self.group_rates
        self.paused_types = frozenset(n for s, n in p.paused if s == "type")
        self.queue_paused = p.queue_paused

    def cap(self, group: str) -> int | None:
        """The most jobs of ``group`` that may run at once (0 while paused; None: no cap)."""
        gp = self.policy.groups.get(group)
        if gp is not None and gp.paused:
            return 0
        if gp is not None and gp.cap is not None:
            return gp.cap
        return self.policy.default.cap

    def weight(self, group: str) -> int | None:
        """``group``'s stored weight (None: the largest weight among its ready jobs)."""
        gp = self.policy.groups.get(group)
        return None if gp is None else gp.weight

    def group_rate(self, group: str) -> RateLimit | None:
        """``group``'s rate (its own, else the ``"*"`` row's), counted under its name."""
        gp = self.policy.groups.get(group)
        r = gp.rate if gp is not None and gp.rate is not None else self.policy.default.rate
        return None if r is None else self._rate(ledger_name(group), r)

    def types(self, types: list[str]) -> list[str]:
        """The types of ``types`` that may start now (none while the queue is paused)."""
        if self.queue_paused:
            return []
        if not self.paused_types:
            return types
        return [t for t in types if t not in self.paused_types]

    def _rate(self, name: str, r: RateLimit) -> RateLimit:
        """The RateLimit counting ``r`` under ``name``: one object per (name, n, per), so
        its statements and ledger sweep are kept across refreshes."""
        key = (name, r.n, r.per)
        got = self._rates.get(key)
        if got is None:
            got = self._rates[key] = RateLimit(r.n, r.per, name=name)
        return got

    # -- refresh -----------------------------------------------------------------------------
    def due(self, now: float) -> bool:
        """Whether the next tick should look at the version token."""
        return self.stale or now - self.read_at >= self.settings.poll_interval

    async def refresh(self, db: Database, force: bool = False) -> bool:
        """Read the policy again if it may have changed; True if it did (then applied)."""
        now = time.monotonic()
        if not force and not self.due(now):
            return False
        self.stale, self.read_at = False, now
        known = self.version

        async def read(conn: AsyncConnection) -> tuple[str | None, Policy | None]:
            v = await read_version(db, conn)
            if v == known and known is not None:
                return v, None
            return v, await read_policy_on(db, conn)

        version, p = await db.read(read)
        self.version = version
        if p is None:
            return False
        first, self.loaded = not self.loaded, True
        if not first and p == self.policy:
            return False
        self.apply(p)
        if not first:  # (the first read is the policy this process starts with)
            self.generation += 1
            self.changed_at = time.monotonic()
        return not first

    def settled(self, now: float) -> bool:
        """Whether every live worker has had time to see the last change (HANDOVER_WAIT)."""
        return now - self.changed_at >= HANDOVER_WAIT * self.settings.poll_interval


async def caps_held(conn: AsyncConnection, db: Database, live: LivePolicy,
                    freed: Mapping[str, int], count_running: Any) -> bool:
    """After a change of the policy, once every live worker has had time to see it
    (``settled``): whether what ran before the caller's finalize (what runs now plus
    ``freed``, by group) is within the global cap and each freed group's cap. Then the
    hand-over, which keeps that count, is right again for this generation (Claimer)."""
    if not live.settled(time.monotonic()):
        return False
    before = (await conn.execute(count_running)).scalar_one() + sum(freed.values())
    if live.concurrency is not None and before > live.concurrency:
        return False
    J = db.t.jobs
    for g, n in freed.items():
        cap = live.cap(g)
        if cap is not None and n + (await conn.execute(
                select(func.count()).select_from(J).where(
                    J.c.state == lit(S.RUNNING), J.c.group_key == g))).scalar_one() > cap:
            return False
    return True


async def group_budgets(conn: AsyncConnection, db: Database,
                        rates: dict[str, RateLimit]) -> dict[str, int]:
    """Starts each group of ``rates`` may still make now (its window's ledger, counted in
    the claim's transaction under the gate): one statement per distinct window length."""
    R = db.t.rate
    by_per: dict[float, list[str]] = defaultdict(list)
    for g, r in rates.items():
        by_per[r.per].append(g)
    used: dict[str, int] = {}
    for per, groups in by_per.items():
        names = {rates[g].name: g for g in groups}
        stmt = (select(R.c.name, func.coalesce(func.sum(R.c.starts), 0))
                .where(R.c.name.in_(list(names)), R.c.at > utcnow_plus(-per))
                .group_by(R.c.name))
        for name, n in (await conn.execute(stmt)).all():
            used[names[name]] = int(n)
    return {g: max(r.n - used.get(g, 0), 0) for g, r in rates.items()}


async def spend_group_rates(conn: AsyncConnection, db: Database, live: LivePolicy,
                            groups: Iterable[str]) -> None:
    """Record the starts just leased (one ``groups`` entry per job) in each rated group's
    ledger, in the claim's transaction."""
    count: dict[str, int] = defaultdict(int)
    for g in groups:
        count[g] += 1
    for g, n in count.items():
        r = live.group_rate(g)
        if r is not None:
            await r.consume(conn, db.t, n)


async def declare(db: Database, s: Settings) -> None:
    """Write what ``JobQueue(concurrency=, group_limits=, limits=[RateLimit])`` declares
    where it differs from the stored policy, logging the old and the new value; nothing
    declared, nothing written (the last declaration or runtime change wins)."""
    p = await read_policy(db)
    if s.concurrency is not None and p.concurrency != s.concurrency:
        await set_policy(db, concurrency=s.concurrency)
        log.info("policy: concurrency %r -> %r (declared)", p.concurrency, s.concurrency)
    rate = next((r for r in s.db_limits if r.name == QUEUE_RATE_NAME), None)
    if rate is not None and _rate_key(p.rate) != _rate_key(rate):
        await set_policy(db, rate=rate)
        log.info("policy: rate %s -> %s (declared)", _rate_text(p.rate), _rate_text(rate))
    for g, n in sorted(s.group_limits.items()):
        old = p.groups.get(g)
        if old is None or old.cap != n:
            await set_group(db, g, cap=n)
            log.info("policy: group %r cap %r -> %r (declared)", g,
                     None if old is None else old.cap, n)


def _rate_key(r: RateLimit | None) -> tuple[int, float] | None:
    return None if r is None else (r.n, r.per)


def _rate_text(r: RateLimit | None) -> str:
    return "None" if r is None else f"{r.n}/{r.per:g}s"

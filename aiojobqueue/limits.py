"""External limits on how many jobs may start: the ``Limit`` protocol and ``RateLimit``."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy import Float, bindparam, delete, func, insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from .errors import ConfigurationError
from .timeutil import utcnow_plus

if TYPE_CHECKING:
    from .schema import Tables

log = logging.getLogger("aiojobqueue.limits")


class Limit:
    """A cap from outside: free GPU memory, a budget, a licence count.

    Subclass it and return how many more jobs may start now from ``available()``; the
    worker never claims more than the minimum over all limits, the global ``concurrency``
    and its own free capacity. ``on_start``/``on_finish`` are called as this process's jobs
    start and finish, for limits that keep their own count.
    """

    async def available(self) -> int:
        """How many more jobs may start right now (may be 0)."""
        raise NotImplementedError

    def on_start(self, job_type: str, group: str) -> None:
        """A job of this process started."""

    def on_finish(self, job_type: str, group: str) -> None:
        """A job of this process finished (any outcome)."""


class RateLimit(Limit):
    """At most ``n`` job starts per ``per`` seconds, across every worker on the database.

    Starts are recorded in the database inside the claim transaction and counted under the
    claim gate, so the rate holds for the whole fleet, not per process. Give several
    RateLimits distinct ``name``s if they must count separately.
    """

    def __init__(self, n: int, per: float = 1.0, *, name: str = "default") -> None:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigurationError(f"RateLimit n must be an int >= 1, got {n!r}")
        if not isinstance(per, (int, float)) or not math.isfinite(per) or per <= 0:
            raise ConfigurationError(f"RateLimit per must be > 0 seconds, got {per!r}")
        if not isinstance(name, str) or not name or len(name) > 100:
            raise ConfigurationError(f"RateLimit name must be 1-100 chars, got {name!r}")
        self.n, self.per, self.name = n, float(per), name
        self._swept = float("-inf")  # monotonic time of this process's last ledger sweep
        self._insert: dict[str, Any] = {}  # the ledger's INSERT, by table name
        self._sum: dict[str, Any] = {}  # the window's SUM, by table name
        #: the starts the last claim of this process found still allowed (before its own):
        #: how far the fleet is from the limit, for the worker's lease-ahead (rounds.py)
        self.headroom = 0

    def __repr__(self) -> str:
        return f"RateLimit({self.n}, per={self.per}, name={self.name!r})"

    def __eq__(self, other: object) -> bool:
        # by value: a stored policy read twice holds equal rates (stored_policy.Policy)
        if not isinstance(other, RateLimit):
            return NotImplemented
        return (self.n, self.per, self.name) == (other.n, other.per, other.name)

    def __hash__(self) -> int:
        return hash((self.n, self.per, self.name))

    async def available(self) -> int:
        """``n``: the fleet-wide count is taken inside each claim (see ``budget``)."""
        return self.n

    async def budget(self, conn: AsyncConnection, tables: Tables) -> int:
        """Starts still allowed now, counted in the claim's transaction (under the gate)."""
        left = max(self.n - await self.used(conn, tables), 0)
        self.headroom = left
        return left

    async def used(self, conn: AsyncConnection, tables: Tables) -> int:
        """The starts recorded in the last ``per`` seconds (database clock), fleet-wide."""
        R = tables.rate
        stmt = self._sum.get(R.name)
        if stmt is None:  # built once: one range of ix_rate, summed
            stmt = self._sum[R.name] = select(func.coalesce(func.sum(R.c.starts), 0)).where(
                R.c.name == bindparam("n", type_=R.c.name.type),
                R.c.at > utcnow_plus(bindparam("w", type_=Float())))
        return int((await conn.execute(stmt, {"n": self.name, "w": -self.per})).scalar_one())

    async def consume(self, conn: AsyncConnection, tables: Tables, count: int) -> None:
        """Record ``count`` starts in the claim's transaction: one row, stamped by the
        database clock, that counts ``count`` until it is ``per`` seconds old (the claim
        leased them all at once, so the window is as exact as one row per start). At most
        once per ``per`` seconds, forget the rows out of reach (older than ``2 * per``: the
        ledger holds at most ``3 * per`` seconds of rows)."""
        if count <= 0:
            return
        R = tables.rate
        stmt = self._insert.get(R.name)
        if stmt is None:  # built once: the time is the database's
            stmt = self._insert[R.name] = insert(R).values(
                name=bindparam("n", type_=R.c.name.type), at=utcnow_plus(0.0),
                starts=bindparam("k", type_=R.c.starts.type))
        await conn.execute(stmt, {"n": self.name, "k": count})
        self.headroom = max(self.headroom - count, 0)
        now = time.monotonic()
        if now - self._swept >= self.per:
            await conn.execute(
                delete(R).where(R.c.name == self.name, R.c.at < utcnow_plus(-self.per * 2))
            )
            self._swept = now


def check_limits(limits: Iterable[object]) -> None:
    """Reject what is not a Limit, and RateLimits sharing a name (they would share one
    ledger and each count the other's starts). Raises ConfigurationError."""
    names: set[str] = set()
    for lim in limits:
        if not isinstance(lim, Limit):
            raise ConfigurationError(f"limits must be Limit instances (subclass it): {lim!r}")
        if isinstance(lim, RateLimit):
            if lim.name in names:
                raise ConfigurationError(
                    f"two RateLimits named {lim.name!r}: give each a distinct name=")
            names.add(lim.name)


async def local_budget(limits: Iterable[Limit], free: int) -> int:
    """``free`` lowered to what every limit allows now. A limit that raises (or answers
    nonsense) allows nothing this tick: fail closed, log it, and keep serving."""
    for lim in limits:
        try:
            n = await lim.available()
            free = min(free, max(int(n), 0))
        except Exception:
            log.exception("limit %r failed in available(); starting nothing this tick", lim)
            return 0
    return free


def notify(limits: Iterable[Limit], event: str, job_type: str, group: str) -> None:
    """Call ``on_start``/``on_finish`` on every limit; one that raises is logged, not fatal."""
    for lim in limits:
        try:
            getattr(lim, event)(job_type, group)
        except Exception:
            log.exception("limit %r failed in %s()", lim, event)

"""Settings: the frozen, validated configuration of one JobQueue.

``JobQueue(...)`` builds one and every inner part reads it; a change (the command line's
``--capacity``, before the queue starts) builds a new one through ``Settings.replace``, which
validates again. Derived values the hot paths test every round are computed once here.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from sqlalchemy.engine import URL

from .errors import ConfigurationError
from .limits import Limit, RateLimit, check_limits
from .schema import DEFAULT_PREFIX

#: connections of the engine a queue builds from a URL (JobQueue's ``pool_size``)
DEFAULT_POOL_SIZE = 5


@dataclass(frozen=True, slots=True)
class Settings:
    """What a JobQueue was configured with (see ``JobQueue`` for each option)."""

    concurrency: int | None = None
    capacity: int = 10
    limits: tuple[Limit, ...] = ()
    group_limits: Mapping[str, int] = field(default_factory=dict)
    lease_ttl: float = 30.0
    heartbeat_interval: float = 10.0
    poll_interval: float = 1.0
    shutdown_timeout: float = 30.0
    prefix: str = DEFAULT_PREFIX
    max_attempts: int = 3
    retry_backoff: float = 1.0
    retry_backoff_max: float = 300.0
    default_group: str = "default"
    worker_id: str = ""
    pool_size: int = DEFAULT_POOL_SIZE
    #: where the push listener connects (already checked by the dialect); None: the engine's
    #: own URL
    listen_url: URL | None = None
    #: the RateLimits (counted in the database, under the claim gate) ...
    db_limits: tuple[RateLimit, ...] = field(init=False)
    #: ... and the other limits (asked in this process before each round)
    local_limits: tuple[Limit, ...] = field(init=False)
    #: claims must take the gate: a global cap, a group cap or a RateLimit is counted
    needs_gate: bool = field(init=False)
    #: a global cap or a group cap counts running jobs: a round's finalize and claim share
    #: one transaction (the claim sees the freed slots), and nothing is leased ahead. A
    #: RateLimit alone counts starts, not slots: neither applies to it
    counts_slots: bool = field(init=False)

    def __post_init__(self) -> None:
        c = self.concurrency
        if c is not None and (not isinstance(c, int) or isinstance(c, bool) or c < 1):
            raise ConfigurationError(f"concurrency must be an int >= 1 or None: {c!r}")
        if not isinstance(self.capacity, int) or self.capacity < 1:
            raise ConfigurationError(f"capacity must be an int >= 1: {self.capacity!r}")
        if self.heartbeat_interval <= 0 or self.poll_interval <= 0 or self.shutdown_timeout < 0:
            raise ConfigurationError("heartbeat_interval and poll_interval must be > 0")
        if self.lease_ttl < 2 * self.heartbeat_interval:
            raise ConfigurationError(
                f"lease_ttl ({self.lease_ttl}s) must be at least twice heartbeat_interval "
                f"({self.heartbeat_interval}s), or a live job's lease can expire between "
                "heartbeats"
            )
        p = self.prefix
        if not isinstance(p, str) or not p.replace("_", "").isalnum() or len(p) > 20:
            raise ConfigurationError(f"prefix must be letters, digits and _ (<= 20): {p!r}")
        for g, n in self.group_limits.items():
            if not isinstance(n, int) or n < 0:
                raise ConfigurationError(f"group limit for {g!r} must be an int >= 0: {n!r}")
        n = self.pool_size
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigurationError(f"pool_size must be an int >= 1: {n!r}")
        if self.listen_url is not None and not isinstance(self.listen_url, URL):
            raise ConfigurationError(f"listen_url must be a parsed URL: {self.listen_url!r}")
        check_limits(self.limits)
        put = object.__setattr__  # (frozen: the derived fields are set once, here)
        put(self, "limits", tuple(self.limits))
        put(self, "group_limits", MappingProxyType(dict(self.group_limits)))
        put(self, "worker_id", self.worker_id or uuid.uuid4().hex[:12])
        for name in ("lease_ttl", "heartbeat_interval", "poll_interval", "shutdown_timeout"):
            put(self, name, float(getattr(self, name)))
        put(self, "db_limits", tuple(x for x in self.limits if isinstance(x, RateLimit)))
        put(self, "local_limits", tuple(x for x in self.limits if not isinstance(x, RateLimit)))
        put(self, "needs_gate", bool(c is not None or self.group_limits or self.db_limits))
        put(self, "counts_slots", bool(c is not None or self.group_limits))

    @classmethod
    def build(cls, limits: Iterable[Limit] = (), group_limits: Mapping[str, int] | None = None,
              **options: Any) -> Settings:
        """Settings from JobQueue's keyword arguments; raises ConfigurationError."""
        return cls(limits=tuple(limits), group_limits=dict(group_limits or {}), **options)

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes``, validated again."""
        names = [f.name for f in dataclasses.fields(self) if f.init]
        return Settings(**{**{n: getattr(self, n) for n in names}, **changes})

    @property
    def margin(self) -> float:
        """A job is stopped this long before its lease could expire unrenewed."""
        return min(self.heartbeat_interval, self.lease_ttl / 4)

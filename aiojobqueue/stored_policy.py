"""The policy in the database: caps, weights, rate limits and pauses as rows (SPEC rev. 3).

One table, ``{prefix}policy``, one row per (scope, name):

* ``("queue", "")``: ``cap`` is the global ``concurrency``, ``rate_n``/``rate_per`` the
  queue's rate, ``paused`` the whole queue's pause;
* ``("group", name)``: that group's ``weight``, ``cap``, rate and pause; the name ``"*"`` is
  the default row: every group without a row of its own takes its cap and rate from it;
* ``("type", name)``: ``paused`` alone.

Every change also writes a new token under ``policy_version`` in the meta table and sends
the wake-up payload ``"policy"`` (PostgreSQL's NOTIFY; a no-op elsewhere), so a worker's
cache (``live_policy.py``) knows to read the rows again without reading them every round.
``None`` clears a value; an argument not given (``UNSET``) leaves it as it is.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from .database import Database
from .dialects.columns import NAME_LEN
from .errors import ConfigurationError
from .limits import RateLimit

log = logging.getLogger("aiojobqueue.policy")

QUEUE, GROUP, TYPE = "queue", "group", "type"
#: the group row every group without one of its own takes its cap and rate from
DEFAULT_ROW = "*"
#: the meta row whose value changes with every change of the policy
VERSION_KEY = "policy_version"
#: the wake-up payload a change sends (a worker refreshes its cache at once on it)
NOTIFY_PAYLOAD = "policy"


class Unset:
    """The type of ``UNSET``: "argument not given" (``None`` clears a value)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = Unset()


@dataclass(frozen=True, slots=True)
class GroupPolicy:
    """One group's stored row (or the ``"*"`` default row): None where it sets nothing."""

    weight: int | None = None
    cap: int | None = None
    rate: RateLimit | None = None
    paused: bool = False

    def is_empty(self) -> bool:
        """Whether the row sets nothing (it is then deleted)."""
        return self.weight is None and self.cap is None and self.rate is None and not self.paused


@dataclass(frozen=True, slots=True)
class Policy:
    """The policy in force, as stored.

    ``paused`` holds ``("group", name)`` and ``("type", name)`` pairs, and ``("queue", "")``
    while the whole queue is paused (``queue_paused`` says the same). ``groups`` has every
    group row but the ``"*"`` one, which is ``default``."""

    concurrency: int | None = None
    rate: RateLimit | None = None
    default: GroupPolicy = GroupPolicy()
    groups: Mapping[str, GroupPolicy] = field(default_factory=lambda: MappingProxyType({}))
    paused: frozenset[tuple[str, str]] = frozenset()

    @property
    def queue_paused(self) -> bool:
        """Whether the whole queue is paused."""
        return (QUEUE, "") in self.paused

    def group(self, name: str) -> GroupPolicy:
        """What applies to group ``name``: its own row's cap and rate, else the ``"*"``
        row's; its own weight (None: the largest weight among its jobs) and pause."""
        own = self.groups.get(name)
        if own is None:
            return GroupPolicy(None, self.default.cap, self.default.rate, False)
        return GroupPolicy(own.weight, own.cap if own.cap is not None else self.default.cap,
                           own.rate if own.rate is not None else self.default.rate,
                           own.paused)


# -- validation: a typed error that changes nothing --------------------------------------
def _check_int(what: str, v: Any, least: int) -> None:
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < least):
        raise ConfigurationError(f"{what} must be an int >= {least} or None, got {v!r}")


def _check_rate(v: Any) -> None:
    if v is not None and not isinstance(v, RateLimit):
        raise ConfigurationError(f"rate must be a RateLimit or None, got {v!r}")


def _check_name(what: str, v: Any) -> str:
    if not isinstance(v, str) or not v or len(v) > NAME_LEN:
        raise ConfigurationError(f"{what} must be a name of 1-{NAME_LEN} characters, got {v!r}")
    return v


def _target(group: str | None, type: str | None) -> tuple[str, str]:
    """The row a pause/resume names: a group, a type, or (neither) the whole queue."""
    if group is not None and type is not None:
        raise ConfigurationError("pause/resume takes group= or type=, not both")
    if group is not None:
        if group == DEFAULT_ROW:
            raise ConfigurationError(
                "the '*' row holds defaults for caps and rates; pause the whole queue with "
                "pause() (no argument) instead")
        return GROUP, _check_name("group", group)
    if type is not None:
        return TYPE, _check_name("type", type)
    return QUEUE, ""


# -- reading --------------------------------------------------------------------------------
def _rate(n: Any, per: Any) -> RateLimit | None:
    return RateLimit(int(n), float(per)) if n is not None and per is not None else None


def policy_from_rows(rows: list[Any]) -> Policy:
    """The Policy of the table's rows (scope, name, weight, cap, rate_n, rate_per, paused)."""
    concurrency, rate = None, None
    default = GroupPolicy()
    groups: dict[str, GroupPolicy] = {}
    paused: set[tuple[str, str]] = set()
    for scope, name, weight, cap, rate_n, rate_per, is_paused in rows:
        if is_paused:
            paused.add((scope, name))
        if scope == QUEUE:
            concurrency, rate = cap, _rate(rate_n, rate_per)
        elif scope == GROUP:
            gp = GroupPolicy(weight, cap, _rate(rate_n, rate_per), bool(is_paused))
            if name == DEFAULT_ROW:
                default = gp
            else:
                groups[name] = gp
    return Policy(concurrency, rate, default, MappingProxyType(groups), frozenset(paused))


async def read_policy_on(db: Database, conn: AsyncConnection) -> Policy:
    """``read_policy`` on the caller's connection."""
    P = db.t.policy
    rows = (await conn.execute(select(
        P.c.scope, P.c.name, P.c.weight, P.c.cap, P.c.rate_n, P.c.rate_per, P.c.paused))).all()
    return policy_from_rows(list(rows))


async def read_policy(db: Database) -> Policy:
    """The policy stored in the database now."""
    return await db.read(lambda conn: read_policy_on(db, conn))


async def read_version(db: Database, conn: AsyncConnection) -> str | None:
    """The token that changes with every change of the policy (None: never changed)."""
    M = db.t.meta
    v = (await conn.execute(select(M.c.value).where(M.c.name == VERSION_KEY))).scalar()
    return None if v is None else str(v)


# -- writing --------------------------------------------------------------------------------
async def _bump(db: Database, conn: AsyncConnection) -> None:
    """A new version token, and a wake-up (delivered at commit) so workers refresh now."""
    M = db.t.meta
    token = uuid.uuid4().hex
    await db.ops.insert_ignore(conn, M, [{"name": VERSION_KEY, "value": token}])
    await conn.execute(update(M).where(M.c.name == VERSION_KEY).values(value=token))
    await db.ops.notify(conn, NOTIFY_PAYLOAD)


async def _row(db: Database, conn: AsyncConnection, scope: str, name: str) -> dict[str, Any]:
    """The row's values, locked for this transaction's update (created empty if missing)."""
    P = db.t.policy
    await db.ops.insert_ignore(conn, P, [{"scope": scope, "name": name, "paused": False}])
    await conn.execute(update(P).where(P.c.scope == scope, P.c.name == name)
                       .values(paused=P.c.paused))  # (takes the row's lock on every dialect)
    row = (await conn.execute(select(P.c.weight, P.c.cap, P.c.rate_n, P.c.rate_per,
                                     P.c.paused).where(P.c.scope == scope, P.c.name == name)
                              )).one()
    return dict(row._mapping)


async def _write_row(db: Database, conn: AsyncConnection, scope: str, name: str,
                     changes: dict[str, Any]) -> None:
    """Apply ``changes`` to the row (None clears); a row left setting nothing is deleted."""
    P = db.t.policy
    row = await _row(db, conn, scope, name)
    row.update(changes)
    where = (P.c.scope == scope, P.c.name == name)
    if all(row[k] is None for k in ("weight", "cap", "rate_n", "rate_per")) and not row["paused"]:
        await conn.execute(delete(P).where(*where))
    else:
        await conn.execute(update(P).where(*where).values(**row))
    await _bump(db, conn)


def _rate_columns(rate: RateLimit | Unset | None) -> dict[str, Any]:
    if isinstance(rate, Unset):
        return {}
    return {"rate_n": rate.n if rate else None, "rate_per": rate.per if rate else None}


async def set_policy(db: Database, *, concurrency: int | Unset | None = UNSET,
                     rate: RateLimit | Unset | None = UNSET) -> Policy:
    """Set the global cap and/or the queue's rate (None clears one); returns the policy
    before the change. Raises ConfigurationError (and changes nothing) on bad input."""
    if not isinstance(concurrency, Unset):
        _check_int("concurrency", concurrency, 1)
    if not isinstance(rate, Unset):
        _check_rate(rate)
    changes = _rate_columns(rate)
    if not isinstance(concurrency, Unset):
        changes["cap"] = concurrency
    return await _change(db, QUEUE, "", changes)


async def set_group(db: Database, name: str, *, weight: int | Unset | None = UNSET,
                    cap: int | Unset | None = UNSET,
                    rate: RateLimit | Unset | None = UNSET) -> Policy:
    """Set group ``name``'s weight, cap and/or rate (None clears one; ``"*"`` is the
    default row); returns the policy before the change. Raises ConfigurationError."""
    _check_name("group", name)
    changes = _rate_columns(rate)
    if not isinstance(weight, Unset):
        if name == DEFAULT_ROW and weight is not None:
            raise ConfigurationError("the '*' row has no weight (a group without one weighs "
                                     "the largest weight among its jobs)")
        _check_int("weight", weight, 1)
        changes["weight"] = weight
    if not isinstance(cap, Unset):
        _check_int("cap", cap, 0)
        changes["cap"] = cap
    if not isinstance(rate, Unset):
        _check_rate(rate)
    return await _change(db, GROUP, name, changes)


async def pause(db: Database, group: str | None = None, type: str | None = None) -> Policy:
    """Pause a group, a type, or (neither) the whole queue: it starts nothing until
    resumed; running jobs finish. Returns the policy before. Raises ConfigurationError."""
    scope, name = _target(group, type)
    return await _change(db, scope, name, {"paused": True})


async def resume(db: Database, group: str | None = None, type: str | None = None) -> Policy:
    """Undo ``pause`` with the same arguments (resuming what is not paused does nothing)."""
    scope, name = _target(group, type)
    return await _change(db, scope, name, {"paused": False})


async def _change(db: Database, scope: str, name: str, changes: dict[str, Any]) -> Policy:
    async def tx(conn: AsyncConnection) -> Policy:
        before = await read_policy_on(db, conn)
        if changes:
            await _write_row(db, conn, scope, name, changes)
        return before

    return await db.write(tx)

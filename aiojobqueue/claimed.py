"""What a claim hands back: ``Claimed`` (a leased attempt, one per job: what the executor
runs and the fence its finalize carries), ``LeaseAsk`` (a claim that rides along with a
finalize call) and ``Hold`` (what a capped worker may hold ahead). The claim itself is
claim.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple


class Claimed(NamedTuple):
    """A leased attempt: what the executor needs to run it and the fence to finish it.
    (Immutable; a NamedTuple rather than a frozen dataclass: one is built for every job,
    in a third of the time.)"""

    id: int
    type: str
    args: dict[str, Any]
    attempt: int
    group: str
    timeout: float | None
    checkpoint: Any
    parent_id: int | None
    #: An edge pointed at this job when it was leased (the flag is never cleared): its
    #: finalize must release dependents, so it skips the one-statement path.
    has_dependents: bool = False
    #: The W3C trace context stored with the job (aiojobqueue.tracing), usually None.
    trace: Any = None


@dataclass
class LeaseAsk:
    """A claim that rides along with a finalize (PostgreSQL's one-call routine, see
    finalize.finish_in_one_call): after the finalize has released what it releases, the
    same call leases up to ``n`` ready jobs of ``group`` and ``types``: the claim() of the
    known single group, without its round trip. ``rows``: what it leased, as
    claim_columns(); None while not done (the routine declined, or was not called)."""

    group: str
    types: list[str]
    n: int
    rows: list[Any] | None = None
    #: a counted cap's hand-over (Slots.hand_ask): at most as many as the call finished
    hand: bool = False
    #: the rows as claim() returns them (see Claimer.asked_claims)
    claimed: list[Claimed] = field(default_factory=list)


@dataclass
class Hold:
    """What a worker may hold ahead under a counted cap (Slots.take_over): at most
    ``limit`` leased jobs, and no more than ``per_slot`` per slot of the group it holds
    once the claim's running leases are added (``slots`` before them); it has ``have``
    already. ``got``: what the claim leased into ``leased``."""

    limit: int
    slots: int
    have: int
    per_slot: int = 1
    got: list[Claimed] = field(default_factory=list)

    def room(self, leasing: int) -> int:
        """How many more to hold once the claim leases ``leasing`` jobs into running."""
        return min(self.limit, self.per_slot * (self.slots + leasing)) - self.have


def claimed_rows(rows: list[Any]) -> list[Claimed]:
    """Leased rows (claim_columns()) in pick order (RETURNING rows come back unordered: a
    prefetched job starts after the better ones claimed with it). By position: a Row's
    attribute look-up costs more, and this runs for every job."""
    rows = sorted(rows, key=lambda r: (-r[8], r[0]))
    return [Claimed(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], bool(r[9]), r[10])
            for r in rows]

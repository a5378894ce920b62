"""Pure scheduling policy: the fair-share split and retry backoff. No I/O here."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class GroupDemand:
    """One group with runnable work, as the claim sees it."""

    weight: int
    running: int = 0
    #: Slots this group may still take under its own cap (None: no cap).
    cap: int | None = None


def fair_share(free: int, groups: Mapping[str, GroupDemand], *, rotate: bool = False,
               after: str | None = None) -> dict[str, int]:
    """Split ``free`` slots among ``groups`` in proportion to their weights.

    Counts what each group already runs: slots go one at a time to the group whose
    ``(running + granted) / weight`` is lowest, so a group with nothing running gets a slot
    before any group gets another one, and in the steady state (one slot freeing at a time)
    starts follow the weights. Ties go to the group with the larger weight, then by name so
    the result is deterministic. Never grants more than ``free`` in total or more than a
    group's ``cap``; grants all of ``free`` unless every group is capped out.

    Guarantee (tested by properties): for a group g granted a slot and any group h still
    open, ``(total_g - 1) / w_g <= total_h / w_h``: no group holds more than one slot beyond
    its weight-proportional share, relative to any other group. O(free * log(groups)).

    ``rotate``: ties go by name in rotation order instead: first the names after ``after``
    (the last group served, see claim.py), then from the start (weight plays no part at a
    tie). The guarantee above holds for any tie order; this one also bounds the wait: a
    group with work and nothing running has the lowest ratio there is, so every slot goes to
    such a group, in rotation order, until it is served: at most ``len(groups) - 1`` slots
    go to others first. The claim reads only the front of that order (claim.Census).
    """
    grant = {g: 0 for g in groups}
    if free <= 0 or not groups:
        return grant
    def tie(g: str, d: GroupDemand) -> tuple[int, str]:
        if rotate:
            return (int(after is not None and g <= after), g)
        return (-d.weight, g)

    heap = [
        (d.running / max(d.weight, 1), tie(g, d), g)
        for g, d in groups.items()
        if d.cap is None or d.cap > 0
    ]
    heapq.heapify(heap)
    for _ in range(free):
        if not heap:
            break
        _, t, g = heapq.heappop(heap)
        grant[g] += 1
        d = groups[g]
        if d.cap is None or grant[g] < d.cap:
            heapq.heappush(heap, ((d.running + grant[g]) / max(d.weight, 1), t, g))
    return grant


def rotation_key(after: str | None) -> Callable[[str], tuple[int, str]]:
    """The rotation order of fair_share(rotate=True, after=after), as a sort key."""
    return lambda g: (int(after is not None and g <= after), g)


#: Exponents past this add nothing (any sane cap is reached long before) and would overflow.
_MAX_DOUBLINGS = 62


def backoff(
    attempt: int, base: float = 1.0, cap: float = 300.0, rng: random.Random | None = None
) -> float:
    """Seconds to wait before retry number ``attempt`` (1-based): exponential, "equal" jitter.

    The delay is drawn uniformly from [d/2, d] with d = min(cap, base * 2**(attempt-1)), so
    retries spread out (no thundering herd) but never come sooner than half the nominal delay.
    Any attempt number works (attempts keep counting across manual retries).
    """
    r = rng if rng is not None else random
    d = min(cap, base * 2.0 ** min(max(attempt - 1, 0), _MAX_DOUBLINGS))
    return float(d / 2 + r.random() * d / 2)

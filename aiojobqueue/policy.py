"""Pure scheduling policy: the fair-share split and retry backoff. No I/O here."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class GroupDemand:
    """One group with runnable work, as the claim sees it."""

    weight: int
    running: int = 0
    #: Slots this group may still take under its own cap (None: no cap).
    cap: int | None = None


def fair_share(free: int, groups: Mapping[str, GroupDemand]) -> dict[str, int]:
    """Split ``free`` slots among ``groups`` in proportion to their weights.

    Counts what each group already runs: slots go one at a time to the group whose
    ``(running + granted) / weight`` is lowest, so a group with nothing running gets a slot
    before any group gets a second one, and in the steady state (one slot freeing at a time)
    starts follow the weights. Ties go to the group with the larger weight, then by name so
    the result is deterministic. Never grants more than ``free`` in total or more than a
    group's ``cap``.
    """
    grant = {g: 0 for g in groups}
    if free <= 0 or not groups:
        return grant
    open_groups = {g for g, d in groups.items() if d.cap is None or d.cap > 0}
    for _ in range(free):
        if not open_groups:
            break
        best = min(
            open_groups,
            key=lambda g: (
                (groups[g].running + grant[g]) / max(groups[g].weight, 1),
                -groups[g].weight,
                g,
            ),
        )
        grant[best] += 1
        cap = groups[best].cap
        if cap is not None and grant[best] >= cap:
            open_groups.discard(best)
    return grant


def backoff(
    attempt: int, base: float = 1.0, cap: float = 300.0, rng: random.Random | None = None
) -> float:
    """Seconds to wait before retry number ``attempt`` (1-based): exponential, full jitter.

    The delay is drawn uniformly from [d/2, d] with d = min(cap, base * 2**(attempt-1)), so
    retries spread out (no thundering herd) but never come sooner than half the nominal delay.
    """
    r = rng if rng is not None else random
    d = min(cap, base * (2 ** max(attempt - 1, 0)))
    return float(d / 2 + r.random() * d / 2)

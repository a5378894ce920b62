"""Properties of the pure scheduling policy: the fair-share split and retry backoff."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from aiojobqueue.policy import GroupDemand, backoff, fair_share

names = st.text("abcdefgh", min_size=1, max_size=3)
demand = st.builds(
    GroupDemand,
    weight=st.integers(1, 20),
    running=st.integers(0, 30),
    cap=st.one_of(st.none(), st.integers(0, 10)),
)
groups_st = st.dictionaries(names, demand, max_size=8)


def _open(d: GroupDemand, granted: int) -> bool:
    return d.cap is None or granted < d.cap


@given(st.integers(-3, 60), groups_st)
def test_split_is_bounded_capped_and_work_conserving(free: int, groups: dict[str, GroupDemand]
                                                     ) -> None:
    plan = fair_share(free, groups)
    assert set(plan) == set(groups)
    assert all(n >= 0 for n in plan.values())
    assert sum(plan.values()) <= max(free, 0)  # never more slots than free
    for g, d in groups.items():
        if d.cap is not None:
            assert plan[g] <= d.cap  # caps respected
    # work-conserving: slots are left over only when every group is capped out
    if sum(plan.values()) < max(free, 0):
        assert not any(_open(d, plan[g]) for g, d in groups.items())


@given(st.integers(0, 60), groups_st)
def test_idle_groups_are_served_first(free: int, groups: dict[str, GroupDemand]) -> None:
    """Every group with work and nothing running gets a slot while slots allow (no
    starvation), before any group gets an extra one."""
    plan = fair_share(free, groups)
    idle = [g for g, d in groups.items() if d.running == 0 and _open(d, 0)]
    if free >= len(idle):
        assert all(plan[g] >= 1 for g in idle)
    else:
        assert sum(1 for g in idle if plan[g] >= 1) == free
        assert sum(plan.values()) == free


def _within_one_slot(totals: dict[str, int], groups: dict[str, GroupDemand],
                     granted: dict[str, int] | None = None) -> None:
    """For g holding slots (granted some, if given) and any h still open:
    (t_g - 1) / w_g <= t_h / w_h — nobody holds a slot more than its weight allows."""
    for g, dg in groups.items():
        if totals[g] == 0 or (granted is not None and granted[g] == 0):
            continue
        for h, dh in groups.items():
            if granted is not None and not _open(dh, granted[h]):
                continue
            assert (totals[g] - 1) * dh.weight <= totals[h] * dg.weight, (g, h, totals)


@given(st.integers(0, 60), groups_st)
def test_weights_respected_within_one_slot(free: int, groups: dict[str, GroupDemand]) -> None:
    plan = fair_share(free, groups)
    totals = {g: d.running + plan[g] for g, d in groups.items()}
    _within_one_slot(totals, groups, plan)


@settings(max_examples=150)
@given(
    weights=st.lists(st.integers(1, 10), min_size=1, max_size=6),
    slots=st.integers(1, 40),
    seed=st.integers(0, 2**32),
)
def test_steady_state_one_slot_at_a_time(weights: list[int], slots: int, seed: int) -> None:
    """Deep backlogs; a random running job finishes, the freed slot is re-split, 300 times.
    At every step each group is within one slot of its weight relative to every other, no
    group exceeds its proportional share by a whole slot, and the total stays at the cap."""
    rng = random.Random(seed)
    w = {f"g{i}": x for i, x in enumerate(weights)}
    total_w = sum(w.values())
    running = dict.fromkeys(w, 0)
    starts: Counter[str] = Counter()

    def refill(free: int) -> None:
        plan = fair_share(free, {g: GroupDemand(w[g], running[g]) for g in w})
        for g, n in plan.items():
            running[g] += n
            starts[g] += n

    refill(slots)
    for _ in range(300):
        jobs = [g for g, n in running.items() for _ in range(n)]
        running[rng.choice(jobs)] -= 1
        refill(1)
        assert sum(running.values()) == slots
        _within_one_slot(running, {g: GroupDemand(w[g]) for g in w})
        for g in w:
            assert running[g] < slots * w[g] / total_w + 1


def test_steady_state_shares_follow_weights() -> None:
    """3:1:1 over 10 slots holds exactly 6:2:2 running, so equal-length jobs start 3:1:1."""
    w = {"a": 3, "b": 1, "c": 1}
    running = fair_share(10, {g: GroupDemand(x) for g, x in w.items()})
    assert running == {"a": 6, "b": 2, "c": 2}
    rng = random.Random(7)
    starts: Counter[str] = Counter()
    for _ in range(5000):
        jobs = [g for g, n in running.items() for _ in range(n)]
        running[rng.choice(jobs)] -= 1
        plan = fair_share(1, {g: GroupDemand(w[g], running[g]) for g in w})
        (g,) = [g for g, n in plan.items() if n]
        running[g] += 1
        starts[g] += 1
    assert running == {"a": 6, "b": 2, "c": 2}
    assert abs(starts["a"] / 5000 - 0.6) < 0.03


def test_ties_are_deterministic_and_prefer_weight() -> None:
    assert fair_share(1, {"b": GroupDemand(1), "a": GroupDemand(1)}) == {"a": 1, "b": 0}
    assert fair_share(1, {"a": GroupDemand(1), "z": GroupDemand(5)}) == {"a": 0, "z": 1}
    assert fair_share(3, {}) == {}


@given(st.integers(1, 10**6), st.floats(0.001, 100.0), st.floats(0.01, 10**4), st.integers())
def test_backoff_bounds(attempt: int, base: float, cap: float, seed: int) -> None:
    d = min(cap, base * 2.0 ** min(attempt - 1, 62))
    x = backoff(attempt, base, cap, random.Random(seed))
    assert d / 2 <= x <= d  # jittered, never sooner than half, never past the cap
    assert x <= cap


@given(st.integers(1, 200), st.floats(0.001, 100.0), st.floats(0.01, 10**4))
def test_backoff_grows_until_the_cap(attempt: int, base: float, cap: float) -> None:
    lo = backoff(attempt, base, cap, _Const(0.0))
    hi = backoff(attempt, base, cap, _Const(1.0))
    nxt = backoff(attempt + 1, base, cap, _Const(0.0))
    assert lo <= hi
    assert nxt >= lo  # the floor never shrinks
    if base * 2.0 ** attempt <= cap:  # not capped yet: the floor doubles
        assert nxt == 2 * lo


class _Const(random.Random):
    def __init__(self, v: float) -> None:
        super().__init__(0)
        self.v = v

    def random(self) -> float:
        return self.v

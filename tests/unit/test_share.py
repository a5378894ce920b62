"""aiojobqueue.share.cap_share: a process's share of the global cap, by properties."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aiojobqueue.share import Peer, cap_share


def test_alone_or_uncapped_means_no_limit() -> None:
    assert cap_share(4, "a", 10, ["work"], [Peer("a", 10, ["work"], 4)]) is None
    assert cap_share(None, "a", 10, ["work"], [Peer("b", 10, ["work"], None)]) is None
    # a process serving other types only does not take a share of this one's
    assert cap_share(4, "a", 10, ["work"], [Peer("b", 10, ["mail"], 4)]) is None


def test_the_issue_case_two_processes_of_capacity_10_under_4() -> None:
    peers = [Peer("app", 10, ["work"], 4), Peer("worker", 10, ["work"], 4)]
    assert cap_share(4, "app", 10, ["work"], peers) == 2
    assert cap_share(4, "worker", 10, ["work"], peers) == 2


def test_what_a_small_process_cannot_use_goes_to_the_others() -> None:
    peers = [Peer("small", 1, ["work"], 6), Peer("big", 10, ["work"], 6)]
    assert cap_share(6, "small", 1, ["work"], peers) == 1
    assert cap_share(6, "big", 10, ["work"], peers) == 5


def test_a_cap_declared_by_another_process_counts() -> None:
    peers = [Peer("b", 10, ["work"], 4)]
    assert cap_share(None, "a", 10, ["work"], peers) == 2


@given(cap=st.integers(1, 64), caps=st.lists(st.integers(1, 16), min_size=2, max_size=8))
def test_shares_fill_the_cap_and_respect_capacity(cap: int, caps: list[int]) -> None:
    peers = [Peer(f"w{i}", c, ["work"], cap) for i, c in enumerate(caps)]
    shares = [cap_share(cap, p.id, p.capacity or 0, ["work"], peers) for p in peers]
    took = [c if s is None else s for s, c in zip(shares, caps, strict=True)]
    assert all(1 <= t <= c for t, c in zip(took, caps, strict=True))
    # never a slot of the cap left unused by the rule while every process has work
    assert sum(took) >= min(cap, sum(caps))
    # even: two processes with room for it differ by at most one slot (rounding up)
    roomy = [t for t, c in zip(took, caps, strict=True) if c > t]
    assert not roomy or max(took) - min(roomy) <= 1 or max(roomy) == min(roomy)

"""LivePolicy's derivations from a Policy (no database): what the claim reads."""

from __future__ import annotations

from types import MappingProxyType

from aiojobqueue import RateLimit
from aiojobqueue.live_policy import LivePolicy, ledger_name
from aiojobqueue.settings import Settings
from aiojobqueue.stored_policy import GroupPolicy, Policy


def live(p: Policy, **settings: object) -> LivePolicy:
    lp = LivePolicy(Settings.build(**settings))  # type: ignore[arg-type]
    lp.apply(p)
    return lp


def test_nothing_stored_counts_nothing() -> None:
    lp = live(Policy())
    assert (lp.concurrency, lp.needs_gate, lp.counts_slots, lp.per_group, lp.rated) == (
        None, False, False, False, False)
    assert lp.cap("g") is None and lp.weight("g") is None and lp.group_rate("g") is None
    assert lp.types(["a", "b"]) == ["a", "b"]


def test_own_row_then_default_row() -> None:
    p = Policy(default=GroupPolicy(cap=2, rate=RateLimit(5, per=10.0)),
               groups=MappingProxyType({"a": GroupPolicy(weight=3, cap=7),
                                        "b": GroupPolicy(weight=2),
                                        "c": GroupPolicy(paused=True, cap=9)}))
    lp = live(p)
    assert (lp.cap("a"), lp.cap("b"), lp.cap("nobody"), lp.cap("c")) == (7, 2, 2, 0)
    assert (lp.weight("a"), lp.weight("b"), lp.weight("nobody")) == (3, 2, None)
    r = lp.group_rate("a")
    assert r is not None and (r.n, r.per, r.name) == (5, 10.0, "group:a")
    assert lp.group_rate("a") is r  # one object per (name, n, per): its sweep is kept
    assert lp.counts_slots and lp.needs_gate and lp.per_group and lp.rated


def test_pauses_filter_types_and_the_queue() -> None:
    lp = live(Policy(paused=frozenset({("type", "fetch")})))
    assert lp.types(["fetch", "send"]) == ["send"]
    lp = live(Policy(paused=frozenset({("queue", "")})))
    assert lp.types(["fetch", "send"]) == []


def test_declared_rate_is_the_object_that_counts_the_stored_rate() -> None:
    declared = RateLimit(10, per=2.0)
    other = RateLimit(3, per=1.0, name="api")
    lp = live(Policy(rate=RateLimit(10, per=2.0)), limits=[declared, other])
    assert lp.db_limits[0] is declared and other in lp.db_limits
    lp.apply(Policy())  # cleared in the database: only the per-process one is left
    assert lp.db_limits == (other,)


def test_long_group_names_fit_the_ledger() -> None:
    assert ledger_name("g") == "group:g"
    long = ledger_name("x" * 200)
    assert len(long) <= 100 and long != ledger_name("x" * 199 + "y")

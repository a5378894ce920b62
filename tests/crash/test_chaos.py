"""Chaos: 3 worker processes run a 600-job DAG while workers are SIGKILLed at random moments
and replaced. Afterwards, from the database and the timestamped event log:

* nothing is lost: every job is done;
* exactly one finalize per job: a done job's result is the result of its last attempt (the
  handler records (job, attempt) in it), at most one worker reported a finalize for it, and
  an attempt that did not finish was re-run only because its worker was killed;
* dependency order held: no attempt of a job started before every dependency's successful
  (final) attempt had ended, and each job saw its dependencies' final results.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from chaoskit import chains, chaos, fan_outs, random_dag
from crashkit import Fleet, fleet_factory  # noqa: F401 - fixture

from aiojobqueue import JobQueue


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_chaos_sigkill_workers_over_a_dag(
    make_queue: Callable[..., JobQueue], fleet_factory: Callable[..., Fleet],  # noqa: F811
    db: str,
) -> None:
    rnd = random.Random(20261129)
    await chaos(make_queue, fleet_factory, db, rnd, random_dag(rnd), poll=0.05)


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_chaos_sigkill_workers_over_chains_leased_by_their_finalize(
    make_queue: Callable[..., JobQueue], fleet_factory: Callable[..., Fleet],  # noqa: F811
    db: str,
) -> None:
    """The same guarantees where a step's lease rides along with its upstream's finalize
    (PostgreSQL): poll_interval=1 keeps the promotion sweep and the census out of the way
    for 0.1 s at a time, so most steps are leased by that call; on PostgreSQL the workers
    report how many were (``rode`` events) and some must have been."""
    rnd = random.Random(20261130)
    events = await chaos(make_queue, fleet_factory, db, rnd, chains(rnd), poll=1.0)
    rode = sum(len(e["jobs"]) for e in events if e["ev"] == "rode")
    if db == "postgresql":
        assert rode >= 100, rode
    else:
        assert rode == 0


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_chaos_sigkill_workers_over_wide_fan_outs_released_in_parts(
    make_queue: Callable[..., JobQueue], fleet_factory: Callable[..., Fleet],  # noqa: F811
    db: str,
) -> None:
    """The same guarantees where each fan-out's release is split (PostgreSQL): its first
    jobs released by the head's finalize, the rest recorded and released by a call of its
    own, or by another worker's sweep where its worker was killed in between. On
    PostgreSQL the workers report the splits (``split`` events: one per head, less any
    whose worker was killed between its finalize and the report)."""
    rnd = random.Random(20261201)
    events = await chaos(make_queue, fleet_factory, db, rnd, fan_outs(rnd), poll=0.05, split=8)
    splits = sum(1 for e in events if e["ev"] == "split")
    if db == "postgresql":
        assert 5 <= splits <= 8, splits
    else:
        assert splits == 0, splits

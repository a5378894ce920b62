"""A worker trusts the one group a census found alone for LOOK_EVERY; when that window
runs out, two index probes (census.others_query) say whether another group has ready jobs,
and only then does the claim read the census. On MariaDB a census reads the whole backlog
of the first group (no loose index scan there): a fleet of 8 busy processes spent most of
the server's time in it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from stmtkit import count_statements

import aiojobqueue.claim as claim_mod
from aiojobqueue import JobQueue
from aiojobqueue.census import CENSUS_CTE


def census_read(stmt: str) -> bool:
    """``stmt`` reads the groups with ready jobs: the census, or PostgreSQL's fair pick
    (lease.fair_pick_stmt: its scan is the CTE ``sa``), which reads them as it leases."""
    return CENSUS_CTE in stmt or "sa(g, n)" in stmt


async def test_a_lapsed_single_group_is_renewed_without_a_census(
    make_queue: Callable[..., JobQueue], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(claim_mod, "LOOK_EVERY", 0.0)  # every window has run out
    q = make_queue(poll_interval=30.0)

    @q.handler("t")
    async def t(ctx: Any) -> None:
        pass

    async with q:
        for _ in range(4):
            await q.enqueue("t", {}, group="a")
        core = q._started()
        claimer, db = core.claimer, core.db

        async def claim(n: int) -> list[str]:
            got = await db.write(lambda conn: claimer.claim(conn, n, ["t"]))
            return [c.group for c in got]

        with count_statements(q) as seen:
            assert await claim(1) == ["a"]
        assert any(map(census_read, seen)), seen  # nothing known yet: the census
        assert claimer.single_group == "a"
        with count_statements(q) as seen:
            assert await claim(1) == ["a"]
        assert not any(map(census_read, seen)), seen  # renewed by the probes
        assert claimer.single_group == "a"
        # a group before "a" in name order and one after it are each seen at once
        for g in ("0", "b"):
            await q.enqueue("t", {}, group=g)
            with count_statements(q) as seen:
                got = await claim(1)
            assert any(map(census_read, seen)), seen
            assert got == [g]  # it runs nothing, "a" runs two: fair share serves it first
            assert claimer.single_group is None


async def test_the_probes_never_stand_in_for_a_census_under_group_limits(
    make_queue: Callable[..., JobQueue], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With group caps the census counts what each group runs: it is never skipped."""
    monkeypatch.setattr(claim_mod, "LOOK_EVERY", 0.0)
    q = make_queue(poll_interval=30.0, group_limits={"a": 2})

    @q.handler("t")
    async def t(ctx: Any) -> None:
        pass

    async with q:
        for _ in range(4):
            await q.enqueue("t", {}, group="a")
        core = q._started()
        claimer, db = core.claimer, core.db
        for want, expect in ((1, 1), (4, 1), (4, 0)):
            with count_statements(q) as seen:
                got = await db.write(lambda conn, w=want: claimer.claim(conn, w, ["t"]))
            assert len(got) == expect
            assert any(map(census_read, seen)), seen

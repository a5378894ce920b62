"""A claim whose one known group has nothing of its types: one pick of that group, not two.

A worker caches the one group a recent census found (``Claimer.single_group``) and picks
from it without a census; when that pick comes back empty the claim runs the census to
look for other groups. The census counts every ready job of a group (not only the
worker's types), so it names the known group again: picking it a second time in the same
transaction can only come back empty too, and on InnoDB each such pick holds the locks of
the other types' ready rows it read until the commit (a claim for them beside this one
skips them: Claimer.passed_over)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stmtkit import count_statements

from aiojobqueue import JobQueue


def _picks(seen: list[str], jobs: str) -> list[str]:
    """The group picks among ``seen``: statements reading ready jobs of one group by type."""
    return [s for s in seen if jobs in s and "type IN" in s and "group_key =" in s
            and "ready" in s and "k.g" not in s]


async def test_a_known_group_that_ran_dry_is_picked_once(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue(poll_interval=30.0)

    @q.handler("a")
    async def a(ctx: Any) -> None:
        pass

    async with q:
        await q.enqueue("b", {})  # ready, of a type this worker does not serve
        core = q._started()
        claimer, db = core.claimer, core.db
        # the first claim's census finds the one group with ready jobs: it is cached
        assert await db.write(lambda conn: claimer.claim(conn, 4, ["a"], quick=True)) == []
        assert claimer.single_group is not None
        with count_statements(q) as seen:
            got = await db.write(lambda conn: claimer.claim(conn, 4, ["a"], quick=True))
        assert got == []
        picks = _picks(seen, core.db.t.jobs.name)
        assert len(picks) == 1, seen
        assert any("k.g" in s for s in seen), seen  # (the census did run after it)
        # and the group is still the one known (nothing else has ready jobs)
        assert claimer.single_group is not None

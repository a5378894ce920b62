"""Workflows (SPEC revision 3): fan-in through containers, snooze, external steps,
debounce, on every database."""

from __future__ import annotations

from typing import Any

from aiojobqueue import JobContext, JobQueue


async def test_fan_in_through_a_container_maps_leaf_ids_to_results(queue: JobQueue) -> None:
    got: dict[int, Any] = {}

    @queue.handler("fetch")
    async def fetch(ctx: JobContext, n: int) -> Any:
        return {"n": n}

    @queue.handler("merge")
    async def merge(ctx: JobContext) -> None:
        got.update(await ctx.dependency_results())

    async with queue.batch() as b:
        box = b.container("box")
        leaves = [b.add("fetch", {"n": n}, parent=box) for n in range(3)]
        inner = b.container("inner", parent=box)
        deep = [b.add("fetch", {"n": 10 + n}, parent=inner) for n in range(2)]
        empty = b.container("empty")
        plain = b.add("fetch", {"n": 99})
        b.add("merge", depends_on=[box, empty, plain])
    await queue.run_until_idle()
    want = {r.id: {"n": n} for n, r in enumerate(leaves)}
    want.update({r.id: {"n": 10 + n} for n, r in enumerate(deep)})
    assert got == {box.id: want, empty.id: {}, plain.id: {"n": 99}}
    assert all(isinstance(k, int) for k in got[box.id])

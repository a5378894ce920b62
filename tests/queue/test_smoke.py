"""The basic life of a DAG on every database."""

from __future__ import annotations

from aiojobqueue import JobQueue, JobState


async def test_dag_runs_in_order(queue: JobQueue) -> None:
    order: list[str] = []

    @queue.handler("step")
    async def step(ctx, name: str) -> dict:
        order.append(name)
        return {"name": name}

    a = await queue.enqueue("step", {"name": "a"})
    async with queue.batch() as b:
        box = b.container("box")
        x = b.add("step", {"name": "x"}, parent=box, depends_on=[a])
        y = b.add("step", {"name": "y"}, parent=box, depends_on=[x])
        z = b.add("step", {"name": "z"}, depends_on=[box])
    await queue.run_until_idle()
    assert order == ["a", "x", "y", "z"]
    assert (await queue.get(box.id)).state == JobState.DONE
    assert await queue.wait(z.id, timeout=5) == {"name": "z"}
    assert (await queue.get(y.id)).result == {"name": "y"}

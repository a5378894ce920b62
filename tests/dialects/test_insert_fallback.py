"""The no-RETURNING insert path (MySQL 8) maps every new row to its id, in order."""

from __future__ import annotations

from aiojobqueue import JobQueue
from aiojobqueue.dialects.mysql import TokenInsert


async def test_insert_without_returning_maps_ids(queue: JobQueue) -> None:
    assert queue._inserter is not None and queue._core is not None
    queue._inserter.path = TokenInsert(queue._core.db.ops)  # MySQL 8's path, on any database
    async with queue.batch() as b:
        box = b.container("box")
        refs = [b.add("t", {"i": i}, parent=box) for i in range(2500)]
        tail = b.add("t", {"i": -1}, depends_on=[refs[0], refs[-1]])
    for i in (0, 1, 1234, 2499):
        job = await queue.get(refs[i].id)
        assert job.args == {"i": i}
        assert job.parent_id == box.id
        assert job.lease_owner is None
    job = await queue.get(tail.id)
    assert job.depends_on == (refs[0].id, refs[-1].id)

"""Tags: written with the job, read back on ``Job.tags``, filtered by (API, listing,
dashboard reads), bulk retry/cancel by tag, deleted with the job; bad tags refused with a
typed error that inserts nothing. On every database."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from aiojobqueue import JobQueue, JobState, SyncQueue, admin, prune
from aiojobqueue.errors import InvalidJobError
from aiojobqueue.tags import (
    MAX_LEN,
    MAX_TAGS,
    InvalidTagError,
    cancel_tagged,
    matching,
    retry_tagged,
)
from aiojobqueue.web import data as Q


async def count(q: JobQueue, table: Any) -> int:
    return int(await q._read(lambda c: c.scalar(select(func.count()).select_from(table))))


async def test_tags_round_trip_and_filter(queue: JobQueue) -> None:
    a = await queue.enqueue("t", {"n": 1}, tags=["invoice:42", "eu"])
    b = await queue.enqueue("t", {"n": 2}, tags=["eu", "eu"])  # a repeat is one tag
    c = await queue.enqueue("t", {"n": 3})  # untagged: the single-statement insert
    async with queue.batch() as bt:
        box = bt.container("box")
        r = bt.add("t", {"n": 4}, parent=box, tags=["invoice:42"])
        r2 = bt.add("t", {"n": 5}, depends_on=[r], tags=("us",))
    assert (await queue.get(a)).tags == ("eu", "invoice:42")
    assert (await queue.get(b)).tags == ("eu",)
    assert (await queue.get(c)).tags == ()
    assert (await queue.get(r.id)).tags == ("invoice:42",)
    assert (await queue.get(r2.id)).tags == ("us",)

    listed = await admin.list_jobs(queue, tag="invoice:42")
    assert [j.id for j in listed] == [r.id, a]  # newest first
    assert listed[0].tags == ("invoice:42",)
    assert [j.id for j in await admin.list_jobs(queue, tag="eu", limit=1)] == [b]
    assert await admin.list_jobs(queue, tag="nope") == []
    # combined with another filter
    assert [j.id for j in await admin.list_jobs(queue, tag="eu", state="ready")] == [b, a]

    data = Q.Data(queue)
    page = await data.jobs(Q.Filters.parse({"tag": "invoice:42"}))
    assert [row.id for row in page.rows] == [r.id, a]
    page = await data.jobs(Q.Filters.parse({"tag": "eu", "state": "ready"}))
    assert [row.id for row in page.rows] == [b, a]
    ids, n = await data.match_ids(Q.Filters.parse({"tag": "eu"}), Q.CANCELLABLE)
    assert ids == [b, a] and n.n == 2


async def test_bad_tags_are_refused_and_insert_nothing(queue: JobQueue) -> None:
    bad: list[Any] = ["x" * (MAX_LEN + 1), "", 7, None, "tab\there",
                      [f"t{i}" for i in range(MAX_TAGS + 1)]]
    for tags in bad:
        value = tags if isinstance(tags, list) else [tags]
        with pytest.raises(InvalidTagError):
            await queue.enqueue("t", tags=value)
    with pytest.raises(InvalidTagError):
        await queue.enqueue("t", tags="eu")  # a string is not a list of tags
    b = queue.batch()
    b.add("t", {"n": 1})
    with pytest.raises(InvalidJobError):  # (InvalidTagError is an InvalidJobError)
        b.add("t", {"n": 2}, tags=[""])
    await b.commit()  # the refused add left nothing behind
    assert await count(queue, queue._t.jobs) == 1
    assert await count(queue, queue._t.tags) == 0
    with pytest.raises(InvalidTagError):
        await admin.list_jobs(queue, tag="x" * (MAX_LEN + 1))
    with pytest.raises(InvalidTagError):
        Q.Filters.parse({"tag": "bad\x00tag"})
    assert MAX_LEN == 100 and issubclass(InvalidTagError, ValueError)


async def test_bulk_cancel_and_retry_by_tag(queue: JobQueue) -> None:
    @queue.handler("boom")
    async def boom(ctx: Any) -> None:
        raise ValueError("no")

    failed = [await queue.enqueue("boom", max_attempts=1, tags=["batch-7"]) for _ in range(3)]
    other = await queue.enqueue("boom", max_attempts=1, tags=["batch-8"])
    await queue.run_until_idle()
    res = await retry_tagged(queue, "batch-7")
    assert sorted(res.changed) == failed and not res.skipped and not res.more
    for jid in failed:
        assert (await queue.get(jid)).state != JobState.FAILED
    assert (await queue.get(other)).state == JobState.FAILED  # another tag: untouched

    later = await queue.enqueue("boom", run_after=timedelta(hours=1), tags=["batch-7"])
    untagged = await queue.enqueue("boom", run_after=timedelta(hours=1))
    res = await cancel_tagged(queue, "batch-7")
    assert sorted(res.changed) == sorted([*failed, later])
    for jid in [*failed, later]:
        assert (await queue.get(jid)).state == JobState.CANCELLED
    assert (await queue.get(untagged)).state == JobState.SCHEDULED
    assert await matching(queue, "batch-7", ("cancelled",)) == sorted([*failed, later],
                                                                     reverse=True)


async def test_prune_deletes_tags_with_jobs(queue: JobQueue) -> None:
    @queue.handler("ok")
    async def ok(ctx: Any) -> None:
        return None

    done = await queue.enqueue("ok", tags=["a", "b"])
    await queue.run_until_idle()
    live = await queue.enqueue("ok", run_after=timedelta(hours=1), tags=["a"])
    res = await prune.prune(queue, timedelta(0))
    assert res.jobs == 1
    assert await count(queue, queue._t.tags) == 1
    assert [j.id for j in await admin.list_jobs(queue, tag="a")] == [live]
    assert done != live


def test_sync_queue_tags(db_url: str, prefix: str, make_queue: Any) -> None:
    make_queue()  # (drops the tables afterwards)
    with SyncQueue(db_url, prefix=prefix) as sq:
        jid = sq.enqueue("t", {"n": 1}, tags=["sync", "eu"])
        with sq.batch() as b:
            r = b.add("t", {"n": 2}, tags=["sync"])
        assert sq.get(jid).tags == ("eu", "sync")
        assert sq.get(r.id).tags == ("sync",)
        with pytest.raises(InvalidTagError):
            sq.enqueue("t", tags=[""])


async def test_cli_jobs_by_tag(queue: JobQueue, db_url: str, prefix: str) -> None:
    import json

    from clikit import acli

    a = await queue.enqueue("t", {"n": 1}, tags=["invoice:7", "eu"])
    await queue.enqueue("t", {"n": 2}, tags=["invoice:8"])
    env = {"AIOJOBQUEUE_URL": db_url, "AIOJOBQUEUE_PREFIX": prefix}
    p = await acli("jobs", "--tag", "invoice:7", "--json", env=env)
    assert p.returncode == 0, p.stderr
    (job,) = json.loads(p.stdout)
    assert job["id"] == a and job["tags"] == ["eu", "invoice:7"]
    p = await acli("jobs", "--tag", "", "--json", env=env)
    assert p.returncode != 0 and "tag" in p.stderr and "Traceback" not in p.stderr

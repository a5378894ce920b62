"""The dashboard's tag filter (page, JSON, bulk actions) and its retention card, through the
ASGI app, on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from webkit import SAME, client

from aiojobqueue import JobQueue


async def test_tag_filter_and_bulk_cancel_by_tag(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()
    async with q:
        a = await q.enqueue("t", run_after=timedelta(hours=1), tags=["invoice-42"])
        b = await q.enqueue("t", run_after=timedelta(hours=1), tags=["invoice-42", "eu"])
        other = await q.enqueue("t", run_after=timedelta(hours=1), tags=["invoice-43"])
        async with client(q) as c:
            page = (await c.get("/jobs", params={"tag": "invoice-42"})).text
            assert f"#{a}" in page and f"#{b}" in page and f"#{other}" not in page
            assert 'name="tag" value="invoice-42"' in page
            api = (await c.get("/api/jobs", params={"tag": "invoice-42"})).json()
            assert [r["id"] for r in api["rows"]] == [b, a]
            bad = await c.get("/api/jobs", params={"tag": "x" * 101})
            assert bad.status_code == 400
            confirm = await c.post("/jobs/cancel", data={"tag": "invoice-42"}, headers=SAME)
            assert confirm.status_code == 200 and "2" in confirm.text
            done = await c.post("/jobs/cancel", data={"tag": "invoice-42", "confirm": "yes"},
                                headers=SAME)
            assert done.status_code == 200
        assert (await q.get(a)).state == "cancelled" and (await q.get(b)).state == "cancelled"
        assert (await q.get(other)).state == "scheduled"


async def test_overview_shows_retention(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()
    async with q, client(q) as c:
        assert "No retention" in (await c.get("/")).text
    q2 = make_queue(retention={"done": timedelta(days=7), "failed": timedelta(hours=12)})
    async with q2, client(q2) as c:
        ov = (await c.get("/")).text
        assert "Finished DAGs are deleted after" in ov and "none yet" in ov
        assert "done 7" in ov and "failed 12" in ov

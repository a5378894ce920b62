"""The dashboard's routes through the ASGI app, on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, select
from webkit import SAME, client, failing_queue, small_dag

from aiojobqueue import JobQueue
from aiojobqueue.errors import ConfigurationError
from aiojobqueue.sql import in_state
from aiojobqueue.web import dashboard
from aiojobqueue.web import data as Q
from aiojobqueue.web import views as V

PAGES = ["/", "/jobs", "/jobs/{fetch}", "/jobs/{report}/dag", "/workers", "/schedules",
         "/api/overview", "/api/jobs", "/api/jobs/{fetch}", "/api/jobs/{report}/dag",
         "/api/workers", "/api/schedules"]
ACTIONS = ["/jobs/{boom}/retry", "/jobs/{lone}/cancel", "/jobs/retry", "/jobs/cancel"]


def ids(dag: Any) -> dict[str, int]:
    return dict(vars(dag))


async def test_every_page_renders(make_queue: Callable[..., JobQueue]) -> None:
    q = await failing_queue(make_queue, concurrency=4)
    dag = await small_dag(q)
    async with client(q) as c:
        for page in PAGES:
            r = await c.get(page.format(**ids(dag)))
            assert r.status_code == 200, (page, r.text[:500])
        ov = (await c.get("/")).text
        for g in ("tenant-a", "tenant-b", "tenant-c"):
            assert g in ov
        job = (await c.get(f"/jobs/{dag.boom}")).text
        assert "the flux capacitor is out of flux" in job and "ValueError" in job
        assert 'id="retry"' in job  # full access: the action is offered
        listing = (await c.get("/jobs", params={"state": "failed"})).text
        assert f"#{dag.boom}" in listing and f"#{dag.lone}" not in listing
        api = (await c.get(f"/api/jobs/{dag.boom}")).json()
        assert api["job"]["state"] == "failed" and api["job"]["error"]["type"] == "ValueError"
        static = await c.get("/static/app.css")
        assert static.status_code == 200 and "text/css" in static.headers["content-type"]
        js = await c.get("/static/app.js")
        assert js.status_code == 200 and "EventSource" in js.text


async def test_overview_counts_and_fair_share(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue(concurrency=4, group_limits={"small": 1})
    async with q:
        for _ in range(5):
            await q.enqueue("t", {}, group="heavy", weight=3)
            await q.enqueue("t", {}, group="light", weight=1)
        await q.enqueue("t", {}, group="small", weight=1)
        await q.enqueue("t", {}, group="light", run_after=3600.0)  # scheduled
        ov = await Q.Data(q).overview()
        by = {g.group: g for g in ov.groups}
        assert by["heavy"].weight == 3 and by["light"].weight == 1
        assert str(by["heavy"].counts["ready"]) == "5"
        assert by["light"].counts["scheduled"] == Q.Count(1)
        # 4 slots by weight 3:1:1, the small group capped at 1
        assert by["heavy"].target + by["light"].target + by["small"].target == 4
        assert by["small"].target == 1 and by["heavy"].target >= 2
        assert ov.totals["ready"] == Q.Count(11)
        assert ov.gauges[0].limit == 4 and ov.gauges[0].used == 0
        assert by["heavy"].oldest_ready is not None and by["heavy"].oldest_ready >= 0
        assert len(ov.throughput) == 60


async def test_jobs_held_ahead_are_counted_as_leased(make_queue: Callable[..., JobQueue]
                                                     ) -> None:
    """A job a capped worker holds ahead (``leased``: uncounted by the caps) has a tile of its
    own on the overview and is not in the running count the global cap's gauge shows."""
    from sqlalchemy import update

    from aiojobqueue.timeutil import db_now

    q = make_queue(concurrency=4)
    async with q:
        ids = [await q.enqueue("t", {}) for _ in range(3)]
        J = q._t.jobs

        async def hold(conn: Any) -> None:
            await conn.execute(update(J).where(J.c.id == ids[0]).values(
                state="leased", lease_owner="w", lease_expires=db_now(), attempts=1))

        await q._write(hold)
        ov = await Q.Data(q).overview()
        assert ov.totals["leased"] == Q.Count(1) and ov.totals["ready"] == Q.Count(2)
        assert ov.gauges[0].used == 0
        async with client(q) as c:
            page = (await c.get("/")).text
            assert 'data-count="leased">1<' in page
            job = (await c.get(f"/api/jobs/{ids[0]}")).json()
            assert job["job"]["state"] == "leased"


async def test_rate_gauge_sums_the_starts_of_each_claim(
    make_queue: Callable[..., JobQueue],
) -> None:
    """The overview's rate gauge counts starts, not ledger rows: a claim writes one row
    for all it leased (schema v8)."""
    from sqlalchemy import insert

    from aiojobqueue import RateLimit
    from aiojobqueue.timeutil import utcnow_plus

    q = make_queue(limits=[RateLimit(100, per=60.0, name="api")])
    async with q:
        R = q._t.rate
        async with q.engine.begin() as conn:
            for ago, k in ((5, 3), (2, 4), (120, 9)):  # the last one out of the window
                await conn.execute(insert(R).values(name="api", at=utcnow_plus(-ago), starts=k))
        ov = await Q.Data(q).overview()
    (rate,) = [g for g in ov.gauges if g.limit == 100]
    assert rate.used == 7


async def test_counts_cap_and_say_so(make_queue: Callable[..., JobQueue],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(V, "CAP", 3)
    monkeypatch.setattr(V, "GROUP_CAP", 3)
    q = make_queue()
    async with q:
        up = await q.enqueue("t", {}, group="g")
        for _ in range(4):
            await q.enqueue("t", {}, group="g")
            await q.enqueue("t", {}, group="g", depends_on=[up])
        ov = await Q.Data(q).overview()
        # ready has an index by group everywhere (the claim's): probed per group, capped
        assert ov.totals["ready"] == Q.Count(3, capped=True)
        assert str(ov.groups[0].counts["ready"]) == "3+"
        # and waiting (schema v7's partial index; ix_ready's prefix on MySQL/MariaDB)
        assert ov.groups[0].counts["waiting"] == Q.Count(3, capped=True)
        async with client(q) as c:
            assert "3+" in (await c.get("/")).text


async def test_throughput_counts_finished_jobs(make_queue: Callable[..., JobQueue]) -> None:
    q = await failing_queue(make_queue)

    @q.handler("ok")
    async def ok(ctx: Any) -> int:
        return 1

    for _ in range(3):
        await q.enqueue("ok", {})
    await q.enqueue("boom", {})
    await q.run_until_idle()
    ov = await Q.Data(q).overview()
    assert sum(m[1] for m in ov.throughput) == 3
    assert sum(m[2] for m in ov.throughput) == 1
    await q.close()


async def test_access_none_is_403_everywhere(make_queue: Callable[..., JobQueue]) -> None:
    q = await failing_queue(make_queue)
    dag = await small_dag(q)
    async with client(q, level=None) as c:
        for page in [*PAGES, "/events"]:
            assert (await c.get(page.format(**ids(dag)))).status_code == 403, page
        for action in ACTIONS:
            r = await c.post(action.format(**ids(dag)), headers=SAME, data={"confirm": "yes"})
            assert r.status_code == 403, action
    assert (await q.get(dag.boom)).state == "failed"
    assert (await q.get(dag.lone)).state == "ready"
    await q.close()


async def test_read_only_hides_and_refuses_actions(make_queue: Callable[..., JobQueue]) -> None:
    q = await failing_queue(make_queue)
    dag = await small_dag(q)
    async with client(q, level="read") as c:
        job = (await c.get(f"/jobs/{dag.boom}")).text
        assert "Retry" not in job and "<form method=\"post\"" not in job
        assert "Bulk actions" not in (await c.get("/jobs")).text
        assert "read-only" in job
        for action in ACTIONS:
            r = await c.post(action.format(**ids(dag)), headers=SAME, data={"confirm": "yes"})
            assert r.status_code == 403, action
            assert "read-only" in r.text
    assert (await q.get(dag.boom)).state == "failed"
    assert (await q.get(dag.lone)).state == "ready"
    await q.close()


@pytest.mark.parametrize("headers", [
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},
    {"Origin": "https://evil.example"},
    {"Origin": "null"},
])
async def test_cross_site_posts_are_refused(make_queue: Callable[..., JobQueue],
                                            headers: dict[str, str]) -> None:
    q = await failing_queue(make_queue)
    dag = await small_dag(q)
    async with client(q) as c:
        for action in ACTIONS:
            r = await c.post(action.format(**ids(dag)), headers=headers, data={"confirm": "yes"})
            assert r.status_code == 403, (action, r.text[:300])
            assert "cross-site" in r.text
    assert (await q.get(dag.boom)).state == "failed"
    assert (await q.get(dag.lone)).state == "ready"
    await q.close()


async def test_actions_are_post_only(make_queue: Callable[..., JobQueue]) -> None:
    q = await failing_queue(make_queue)
    dag = await small_dag(q)
    async with client(q) as c:
        for action in ACTIONS:
            assert (await c.get(action.format(**ids(dag)))).status_code in (404, 405), action
    assert (await q.get(dag.boom)).state == "failed"
    await q.close()


async def test_retry_and_cancel(make_queue: Callable[..., JobQueue]) -> None:
    q = await failing_queue(make_queue)
    dag = await small_dag(q)
    async with client(q) as c:
        r = await c.post(f"/jobs/{dag.boom}/retry", headers=SAME)
        assert r.status_code == 303 and r.headers["location"].endswith(f"/jobs/{dag.boom}")
        assert (await q.get(dag.boom)).state in ("ready", "scheduled")
        # same origin by Origin header alone (an older browser)
        r = await c.post(f"/jobs/{dag.fetch}/cancel", headers={"Origin": "http://dash"})
        assert r.status_code == 303
        assert (await q.get(dag.fetch)).state == "cancelled"
        # its dependent inside the container, and what waits on the container, follow
        assert (await q.get(dag.parse)).state == "cancelled"
        assert (await q.get(dag.report)).state == "cancelled"
        # retry of a job that is not failed: a clear refusal, nothing changes
        r = await c.post(f"/jobs/{dag.lone}/retry", headers=SAME)
        assert r.status_code == 409 and "only failed or cancelled" in r.text
        assert (await q.get(dag.lone)).state == "ready"
        assert (await c.post("/jobs/999999999/cancel", headers=SAME)).status_code == 404
    await q.close()


async def test_bulk_cancel_asks_first(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()
    async with q:
        mine = [await q.enqueue("t", {}, group="doomed") for _ in range(7)]
        other = await q.enqueue("t", {}, group="kept")
        async with client(q) as c:
            r = await c.post("/jobs/cancel", headers=SAME, data={"group": "doomed"})
            assert r.status_code == 200
            assert "Cancel 7 jobs?" in r.text and 'name="confirm" value="yes"' in r.text
            assert [(await q.get(j)).state for j in mine] == ["ready"] * 7  # asked, not done
            r = await c.post("/jobs/cancel", headers=SAME,
                             data={"group": "doomed", "confirm": "yes"})
            assert r.status_code == 200 and "7 jobs cancelled" in r.text
        assert [(await q.get(j)).state for j in mine] == ["cancelled"] * 7
        assert (await q.get(other)).state == "ready"


async def test_bulk_retry_matches_error_text(make_queue: Callable[..., JobQueue]) -> None:
    q = await failing_queue(make_queue)
    fails = [await q.enqueue("boom", {}) for _ in range(3)]
    await q.run_until_idle()
    async with client(q) as c:
        r = await c.post("/jobs/retry", headers=SAME, data={"q": "FLUX capacitor"})
        assert "Retry 3 jobs?" in r.text
        r = await c.post("/jobs/retry", headers=SAME, data={"q": "no such text"})
        assert "Retry 0 jobs?" in r.text and "Nothing to retry" in r.text
        r = await c.post("/jobs/retry", headers=SAME, data={"q": "flux", "confirm": "yes"})
        assert "3 jobs retried" in r.text
    assert {(await q.get(j)).state for j in fails} <= {"ready", "scheduled"}
    await q.close()


async def test_bad_input_gets_a_clear_answer(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()
    async with q:
        jid = await q.enqueue("t", {})
        async with client(q) as c:
            r = await c.get("/jobs", params={"state": "bogus"})
            assert r.status_code == 400 and "unknown state" in r.text
            assert (await c.get("/jobs", params={"parent": "abc"})).status_code == 400
            assert (await c.get("/jobs", params={"before": "-3"})).status_code == 400
            assert (await c.get("/jobs", params={"q": "x" * 500})).status_code == 400
            assert (await c.get("/jobs/999999999")).status_code == 404
            assert (await c.get("/jobs/99999999999999999999")).status_code == 404
            r = await c.get("/api/jobs/999999999")
            assert r.status_code == 404 and "no job" in r.json()["error"]
            r = await c.post("/jobs/cancel", headers=SAME, data={"state": "bogus",
                                                                 "confirm": "yes"})
            assert r.status_code == 400
        assert (await q.get(jid)).state == "ready"


async def test_bad_access_callable(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()
    with pytest.raises(ConfigurationError):
        dashboard(q, access="full")  # type: ignore[arg-type]
    async with q:
        async def admin(request: Any) -> str:
            return "full"

        async with client(q) as c:  # async access callables work too
            c._transport.app = dashboard(q, access=admin)  # type: ignore[attr-defined]
            assert (await c.get("/")).status_code == 200


async def test_keyset_paging_covers_every_job_once(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()
    async with q:
        async with q.batch() as b:
            refs = [b.add("t", {"i": i}, group="a" if i % 2 else "b") for i in range(130)]
        all_ids = sorted((r.id for r in refs), reverse=True)
        async with client(q) as c:
            seen: list[int] = []
            before = None
            while True:
                page = (await c.get("/api/jobs", params={"before": before} if before else {}))
                body = page.json()
                seen += [r["id"] for r in body["rows"]]
                before = body["next_before"]
                if before is None:
                    break
            assert seen == all_ids
            # the HTML page links the next page
            html = (await c.get("/jobs")).text
            assert re.search(r'href="[^"]*before=\d+"', html)


async def test_filtered_pages_scan_a_window(make_queue: Callable[..., JobQueue],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(V, "WINDOW", 20)
    q = make_queue()
    async with q:
        async with q.batch() as b:
            refs = [b.add("t", {}, group="rare" if i in (3, 70) else "common")
                    for i in range(100)]
        rare = [refs[70].id, refs[3].id]
        data = Q.Data(q)
        f = Q.Filters(group="rare")
        found: list[int] = []
        page = await data.jobs(f)
        pages = 1
        while True:
            found += [r.id for r in page.rows]
            if page.next_before is None:
                break
            page = await data.jobs(f, page.next_before)
            pages += 1
        assert found == rare
        assert pages >= 5  # 100 ids in windows of 20: the scan is bounded per page


async def test_job_page_wires_explain_when_the_queue_has_it(
        make_queue: Callable[..., JobQueue], monkeypatch: pytest.MonkeyPatch) -> None:
    q = make_queue()
    async with q:
        up = await q.enqueue("t", {})
        down = await q.enqueue("t", {}, depends_on=[up])

        class Reason:
            def __init__(self, code: str, detail: str) -> None:
                self.code, self.detail, self.data = code, detail, [up]

        class Explanation:
            reasons = [Reason("waiting_on", f"waits on job {up}")]

            def __str__(self) -> str:
                return f"Job {down} waits on job {up}, which has not run yet."

        async def explain(job_id: int) -> Explanation:
            return Explanation()

        if getattr(q, "explain", None) is None:
            monkeypatch.setattr(q, "explain", explain, raising=False)
        async with client(q) as c:
            html = (await c.get(f"/jobs/{down}")).text
            assert "Why it is not running" in html and f"job {up}" in html
            api = (await c.get(f"/api/jobs/{down}")).json()
            assert api["explain"]["text"]


async def test_workers_page_lists_a_serving_worker(make_queue: Callable[..., JobQueue]) -> None:
    import asyncio

    from conftest import eventually

    q = make_queue()
    release = asyncio.Event()

    @q.handler("hold")
    async def hold(ctx: Any) -> None:
        await release.wait()

    async with q:
        jid = await q.enqueue("hold", {})
        task = asyncio.create_task(q.serve())
        try:
            async def running() -> bool:
                return (await q.get(jid)).state == "running"

            await eventually(running)
            data = Q.Data(q)

            async def listed() -> bool:
                return any(w.running == 1 and w.live for w in await data.workers())

            await eventually(listed)
            async with client(q) as c:
                html = (await c.get("/workers")).text
                assert q.worker_id in html
                job = (await c.get(f"/jobs/{jid}")).text
                assert "expires in" in job and q.worker_id in job
        finally:
            release.set()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_schedules_page(make_queue: Callable[..., JobQueue]) -> None:
    q = make_queue()
    q.periodic("nightly", type="t", every=3600.0)
    async with q:
        rows = await Q.Data(q).schedules()
        assert [r.name for r in rows] == ["nightly"] and rows[0].every == "every 3600 s"
        async with client(q) as c:
            assert "nightly" in (await c.get("/schedules")).text


async def test_mounted_in_fastapi_links_stay_under_the_mount(
        make_queue: Callable[..., JobQueue]) -> None:
    import httpx
    from fastapi import FastAPI

    q = await failing_queue(make_queue)
    dag = await small_dag(q)
    app = FastAPI()
    app.mount("/ops/queue", dashboard(q, access=lambda request: "full"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://app") as c:
        html = (await c.get("/ops/queue/")).text
        assert 'href="http://app/ops/queue/jobs"' in html
        assert 'data-live="http://app/ops/queue/events"' in html
        css = re.search(r'href="([^"]+app\.css)"', html)
        assert css and (await c.get(css.group(1))).status_code == 200
        dag_html = (await c.get(f"/ops/queue/jobs/{dag.report}/dag")).text
        assert f'href="http://app/ops/queue/jobs/{dag.fetch}/dag"' in dag_html
        r = await c.post(f"/ops/queue/jobs/{dag.boom}/retry", headers=SAME)
        assert r.status_code == 303
        assert r.headers["location"] == f"http://app/ops/queue/jobs/{dag.boom}"
        assert (await c.get("/ops/queue/api/jobs/999999")).json()["status"] == 404
    await q.close()


async def test_every_overview_count_is_an_index_probe(
    make_queue: Callable[..., JobQueue],
) -> None:
    """Each state the overview counts per group has an index leading with (state,
    group_key) on every database (schema v7's partial ones on PostgreSQL and SQLite,
    ``ix_ready`` on MySQL/MariaDB), so no count reads the table; and the planner takes it."""
    q = make_queue()
    async with q:
        data = Q.Data(q)
        async with q.engine.connect() as conn:
            covered = await data._per_group_indexed(conn)
            # leased rows are at most a few per slot of the fleet: their GROUP BY reads the
            # ix_leased range (state first), not the table's other rows
            assert set(Q.LEAF_COUNTED) - {"leased"} <= covered
            if conn.dialect.name == "sqlite":
                for state in ("waiting", "scheduled", "failed"):
                    stmt = (select(q._t.jobs.c.group_key, func.count())
                            .where(*in_state(q._t.jobs, state))
                            .group_by(q._t.jobs.c.group_key))
                    sql = str(stmt.compile(conn.engine, compile_kwargs={"literal_binds": True}))
                    plan = " ".join(str(r[-1]) for r in await conn.exec_driver_sql(
                        f"EXPLAIN QUERY PLAN {sql}"))
                    assert f"{q.prefix}ix_{state}_group" in plan, plan

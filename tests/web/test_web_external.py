"""The dashboard and external steps: the DAG view shows them (waiting for whom, since
when, until when), the job page completes or fails them (full access, POST, same site)."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta

from webkit import SAME, client

from aiojobqueue import JobQueue, JobState


async def test_dag_view_and_job_page_act_on_an_external_step(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue()
    async with q:
        async with q.batch() as b:
            first = b.external("approval", timeout=timedelta(hours=1))
            gated = b.external("sign-off", depends_on=[first])
            after = b.add("ship", depends_on=[gated])
            refused = b.external("review")
        async with client(q) as c:
            svg = (await c.get(f"/jobs/{after.id}/dag")).text
            assert 'data-state="external"' in svg and "s-external" in svg
            assert "waiting for complete() or fail() since" in svg and "fails at" in svg
            assert "waits for its dependencies, then for complete() or fail()" in svg
            page = (await c.get(f"/jobs/{first.id}")).text
            assert 'id="complete"' in page and 'id="fail"' in page
            assert "complete() or fail()" in page  # the why card (explain)
            # read access: no form, and a POST is refused
            async with client(q, level="read") as ro:
                assert 'id="complete"' not in (await ro.get(f"/jobs/{first.id}")).text
                r = await ro.post(f"/jobs/{first.id}/complete", headers=SAME)
                assert r.status_code == 403
            r = await c.post(f"/jobs/{first.id}/complete", headers={"Sec-Fetch-Site": "cross-site"})
            assert r.status_code == 403
            assert (await c.get(f"/jobs/{first.id}/complete")).status_code == 405
            r = await c.post(f"/jobs/{first.id}/complete", headers=SAME, data={"result": "{bad"})
            assert r.status_code == 400 and "not JSON" in r.text
            assert (await q.get(first.id)).state == JobState.EXTERNAL
            r = await c.post(f"/jobs/{first.id}/complete", headers=SAME,
                             data={"result": '{"approved": true}'})
            assert r.status_code == 303
            assert (await q.get(first.id)).result == {"approved": True}
            assert (await q.get(gated.id)).state == JobState.EXTERNAL
            # twice: refused, nothing changed
            r = await c.post(f"/jobs/{first.id}/complete", headers=SAME, data={"result": "2"})
            assert r.status_code == 409 and "already done" in r.text
            r = await c.post(f"/jobs/{refused.id}/fail", headers=SAME,
                             data={"message": "not good enough"})
            assert r.status_code == 303
            job = await q.get(refused.id)
            assert job.state == JobState.FAILED and job.error is not None
            assert job.error["message"] == "not good enough"


async def test_dag_view_draws_run_conditions_as_dashed_edges(
    make_queue: Callable[..., JobQueue],
) -> None:
    q = make_queue()
    async with q:
        async with q.batch() as b:
            work = b.add("work")
            cleanup = b.add("cleanup", depends_on=[work], when="failed")
            report = b.add("report", depends_on=[work], when="finished")
            plain = b.add("next", depends_on=[work])
        async with client(q) as c:
            svg = (await c.get(f"/jobs/{work.id}/dag")).text
    for v in (cleanup.id, report.id):
        assert re.search(rf'class="edge[^"]* cond[^"]*" data-from="{work.id}" data-to="{v}"', svg)
    assert f'class="edge" data-from="{work.id}" data-to="{plain.id}"' in svg
    assert "runs when a dependency failed" in svg and "runs when all finished" in svg

"""The dashboard shows the STORED policy and edits it (issue 33 item 5, SPEC rev. 3), through
the ASGI app on SQLite, PostgreSQL and MariaDB: the overview's gauges, the "*" default, per
group weight / cap / rate / pause, the fair-share targets only under a global cap; the
edits (full access, POST, same origin) and their refusals; ``/api/policy``."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from webkit import SAME, client

from aiojobqueue import JobQueue, RateLimit
from aiojobqueue.policy_text import policy_data
from aiojobqueue.web.data import Data

EDITS = [
    ("/policy", {"concurrency": "5"}),
    ("/policy/group", {"name": "tenant-a", "cap": "1"}),
    ("/policy/pause", {"group": "tenant-b"}),
    ("/policy/resume", {}),
]


async def started(make_queue: Callable[..., JobQueue], **kw: Any) -> JobQueue:
    """A started queue with ready jobs in two groups (no handler: they stay ready)."""
    q = make_queue(**kw)
    await q.start()
    for g, n in (("tenant-a", 3), ("tenant-b", 2)):
        for _ in range(n):
            await q.enqueue("t", {}, group=g, weight=2 if g == "tenant-b" else 1)
    return q


def row(html: str, group: str) -> str:
    m = re.search(rf'<tr data-group="{group}".*?</tr>', html, re.S)
    assert m, group
    return m.group(0)


async def test_the_overview_shows_the_stored_policy_not_the_process_settings(
        make_queue: Callable[..., JobQueue]) -> None:
    # the process declares a cap of 4, then the stored policy drops it: the page says none
    q = await started(make_queue, concurrency=4)
    await q.set_policy(concurrency=None)
    async with client(q) as c:
        ov = (await c.get("/api/overview")).json()
        assert ov["gauges"][0] == {"name": "running", "used": 0, "limit": None,
                                   "detail": "no global cap is set (none in the stored policy)"}
        assert ov["targets"] is False and {g["target"] for g in ov["groups"]} == {None}
        html = (await c.get("/")).text
        assert "global cap 4" not in html and "fair-share target" not in html
        assert 'id="pol-concurrency">none<' in html

        await q.set_policy(concurrency=3, rate=RateLimit(50, per=60.0))
        await q.set_group("*", cap=2, rate=RateLimit(7, per=10.0))
        await q.set_group("tenant-b", weight=5, cap=1)
        await q.pause(group="tenant-a")
        await q.pause(type="fetch")
        ov = (await c.get("/api/overview")).json()
        assert ov["gauges"][:2] == [
            {"name": "global cap", "used": 0, "limit": 3,
             "detail": "stored policy: every worker holds it"},
            {"name": "rate", "used": 0, "limit": 50, "detail": "starts in the last 60 s"}]
        groups = {g["group"]: g for g in ov["groups"]}
        a, b = groups["tenant-a"], groups["tenant-b"]
        # a paused group takes no share; tenant-b's own cap (1) bounds its target
        assert ov["targets"] is True and a["target"] == 0 and b["target"] == 1
        assert b["weight"] == 5 and b["cap"] == 1 and b["rule"]["cap_default"] is False
        assert a["cap"] == 2 and a["rule"]["cap_default"] is True and a["rule"]["paused"]
        assert a["rule"]["rate"] == {"n": 7, "per": 10.0} and a["rule"]["rate_default"]
        assert ov["policy"] == policy_data(await q.policy())
        html = (await c.get("/")).text
        assert "fair-share target" in html and 'id="pol-concurrency">3<' in html
        assert "group-paused" in row(html, "tenant-a")
        assert "group-paused" not in row(html, "tenant-b")
        assert 'id="pol-types"><span class="state s-cancelled">fetch' in html
        assert "cap 2, rate 7/10s" in html
        await q.pause()
        assert 'id="queue-paused"' in (await c.get("/")).text
        assert (await c.get("/api/overview")).json()["targets"] is False
        assert (await c.get("/api/policy")).json() == policy_data(await q.policy())
    await q.close()


async def test_full_access_edits_the_policy(make_queue: Callable[..., JobQueue]) -> None:
    q = await started(make_queue)
    async with client(q) as c:
        html = (await c.get("/")).text
        for form in ("policy-form", "default-form", "group-form", "type-form"):
            assert f'id="{form}"' in html
        assert 'data-pause="tenant-a"' in html
        r = await c.post("/policy", data={"concurrency": "6", "rate": "20/1m"}, headers=SAME)
        assert r.status_code == 303 and r.headers["location"].endswith("/#policy")
        await c.post("/policy/group", data={"name": "*", "cap": "2", "rate": "5/10"},
                     headers=SAME)
        await c.post("/policy/group", data={"name": "tenant-a", "weight": "3", "cap": "1",
                                            "rate": ""}, headers=SAME)
        await c.post("/policy/pause", data={"group": "tenant-b"}, headers=SAME)
        await c.post("/policy/pause", data={"type": "fetch"}, headers=SAME)
        p = await q.policy()
        assert p.concurrency == 6 and p.rate is not None and (p.rate.n, p.rate.per) == (20, 60.0)
        assert (p.default.cap, p.default.rate and p.default.rate.n) == (2, 5)
        a = p.groups["tenant-a"]
        assert (a.weight, a.cap, a.rate) == (3, 1, None)
        assert p.paused == {("group", "tenant-b"), ("type", "fetch")}
        html = (await c.get("/")).text
        assert 'data-resume="tenant-b"' in html and 'data-resume-type="fetch"' in html
        # empty clears; a field not sent is left as it is
        await c.post("/policy", data={"concurrency": ""}, headers=SAME)
        await c.post("/policy/resume", data={"group": "tenant-b"}, headers=SAME)
        await c.post("/policy/resume", data={"type": "fetch"}, headers=SAME)
        await c.post("/policy/pause", data={}, headers=SAME)  # the whole queue
        p = await q.policy()
        assert p.concurrency is None and p.rate is not None and p.paused == {("queue", "")}
        await c.post("/policy/resume", data={}, headers=SAME)
        assert (await q.policy()).paused == frozenset()
    await q.close()


@pytest.mark.parametrize(("path", "form", "says"), [
    ("/policy", {"concurrency": "0"}, "concurrency must be a whole number &gt;= 1"),
    ("/policy", {"rate": "fast"}, "rate must be N/SECONDS"),
    ("/policy", {}, "nothing to set"),
    ("/policy/group", {"name": "g", "cap": "-2"}, "cap must be a whole number &gt;= 0"),
    ("/policy/group", {"name": "*", "weight": "2"}, "the &#39;*&#39; row has no weight"),
    ("/policy/group", {"name": "", "cap": "1"}, "group must be a name"),
    ("/policy/pause", {"type": ""}, "name the type"),
    ("/policy/pause", {"group": "g", "type": "t"}, "not both"),
    ("/policy/pause", {"group": "*"}, "the &#39;*&#39; row holds defaults"),
])
async def test_bad_input_is_400_and_changes_nothing(
        make_queue: Callable[..., JobQueue], path: str, form: dict[str, str],
        says: str) -> None:
    q = await started(make_queue)
    await q.set_policy(concurrency=2)
    before = policy_data(await q.policy())
    async with client(q) as c:
        r = await c.post(path, data=form, headers=SAME)
        assert r.status_code == 400 and says in r.text, r.text[-800:]
    assert policy_data(await q.policy()) == before
    await q.close()


@pytest.mark.parametrize("headers", [
    {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
    {"Origin": "https://evil.example"}, {"Origin": "null"},
])
async def test_cross_site_edits_are_refused(make_queue: Callable[..., JobQueue],
                                            headers: dict[str, str]) -> None:
    q = await started(make_queue)
    async with client(q) as c:
        for path, form in EDITS:
            r = await c.post(path, data=form, headers=headers)
            assert r.status_code == 403 and "cross-site" in r.text, path
    assert (await q.policy()).concurrency is None and not (await q.policy()).groups
    await q.close()


async def test_read_access_hides_and_refuses_the_edits(
        make_queue: Callable[..., JobQueue]) -> None:
    q = await started(make_queue)
    await q.set_policy(concurrency=3)
    async with client(q, "read") as c:
        html = (await c.get("/")).text
        assert 'id="pol-concurrency">3<' in html  # shown
        assert "<form" not in html and "<input" not in html  # but nothing to edit
        for path, form in EDITS:
            r = await c.post(path, data=form, headers=SAME)
            assert r.status_code == 403 and "read-only" in r.text, path
        assert (await c.get("/api/policy")).json()["concurrency"] == 3
    async with client(q, None) as c:
        assert (await c.get("/api/policy")).status_code == 403
    p = await q.policy()
    assert p.concurrency == 3 and not p.groups and not p.paused
    await q.close()


async def test_a_policy_change_moves_the_live_marker(
        make_queue: Callable[..., JobQueue]) -> None:
    """Open pages re-render when the policy changes (the marker the live watcher reads)."""
    q = await started(make_queue)
    data = Data(q)
    first = await data.marker()
    assert await data.marker() == first
    await q.set_group("tenant-a", cap=1)
    second = await data.marker()
    assert second != first
    await q.pause(type="x")
    assert await data.marker() != second
    await q.close()

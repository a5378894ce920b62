"""Handlers: the decorator returns a ``Handler`` (still the coroutine function, with
``.enqueue``, accepted by ``b.add`` and ``queue.enqueue``); args are checked against the
handler's signature at enqueue time (a typed error naming the argument, nothing inserted);
children of a container take its group and weight."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from aiojobqueue import (
    ConfigurationError,
    Handler,
    InvalidJobError,
    JobContext,
    JobQueue,
    JobRef,
    JobState,
)
from aiojobqueue.schema import build_tables


async def job_count(q: JobQueue) -> int:
    """Rows in the jobs table: bad input must leave it unchanged."""
    jobs = build_tables(q.prefix).jobs
    async with q.engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(jobs))).scalar_one())


# -- the Handler object -----------------------------------------------------------------------
async def test_the_decorator_returns_a_handler_that_is_still_the_function() -> None:
    q = JobQueue("sqlite:///unused.db")

    async def resize(ctx: Any, image: str, width: int = 100) -> dict[str, Any]:
        """Resize one image."""
        return {"image": image, "width": width, "ctx": ctx}

    h = q.handler("resize", timeout=5.0)(resize)
    assert isinstance(h, Handler) and h.type == "resize"
    assert h.__name__ == "resize" and h.__doc__ == "Resize one image."
    assert h.__qualname__ == resize.__qualname__ and h.__module__ == __name__
    assert h.__wrapped__ is resize and h.fn is resize
    assert inspect.signature(h) == inspect.signature(resize)
    assert await h("c", image="a.png") == {"image": "a.png", "width": 100, "ctx": "c"}
    assert "resize" in repr(h)


async def test_handler_enqueue_runs_the_job(queue: JobQueue) -> None:
    @queue.handler("fetch")
    async def fetch(ctx: JobContext, url: str) -> dict[str, Any]:
        return {"url": url, "group": ctx.group}

    jid = await fetch.enqueue({"url": "u1"}, group="tenant-a")
    assert isinstance(jid, int)
    job = await queue.get(jid)
    assert job.type == "fetch" and job.group == "tenant-a" and job.args == {"url": "u1"}
    await queue.run_until_idle()
    assert await queue.wait(jid, timeout=10) == {"url": "u1", "group": "tenant-a"}


async def test_a_handler_is_accepted_wherever_a_type_is(queue: JobQueue) -> None:
    @queue.handler("fetch")
    async def fetch(ctx: JobContext, url: str) -> str:
        return url

    @queue.handler("join")
    async def join(ctx: JobContext) -> list[Any]:
        return sorted((await ctx.dependency_results()).values())

    async with queue.batch() as b:
        a = b.add(fetch, {"url": "a"})
        c = b.add(fetch, {"url": "c"})
        j = b.add(join, {}, depends_on=[a, c])
    assert isinstance(j, JobRef) and j.type == "join"
    one = await queue.enqueue(fetch, {"url": "b"})
    await queue.run_until_idle()
    assert await queue.wait(j.id, timeout=10) == ["a", "c"]
    assert await queue.wait(one, timeout=10) == "b"


async def test_a_handler_registered_again_wraps_the_function_not_the_handler() -> None:
    q = JobQueue("sqlite:///unused.db")

    @q.handler("a")
    async def a(ctx: Any, n: int) -> int:
        return n

    b = q.handler("b")(a)
    assert b.fn is a.fn and b.type == "b"
    assert await b(None, n=3) == 3


def test_bad_handlers_are_refused_when_registered() -> None:
    q = JobQueue("sqlite:///unused.db")

    def gen(ctx: Any) -> Any:
        yield 1

    async def no_ctx(*, url: str) -> None: ...

    async def positional_only(ctx: Any, url: str, /) -> None: ...

    with pytest.raises(ConfigurationError, match="not a generator"):
        q.handler("g")(gen)
    with pytest.raises(ConfigurationError, match="must be a function"):
        q.handler("c")(int)
    with pytest.raises(ConfigurationError, match="first positional"):
        q.handler("n")(no_ctx)
    with pytest.raises(ConfigurationError, match="'url' is positional-only"):
        q.handler("p")(positional_only)
    with pytest.raises(ConfigurationError, match="retry_on"):
        q.handler("r", retry_on=("OSError",))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="retry_on"):
        q.handler("r", retry_on=(OSError, 3))  # type: ignore[arg-type]
    assert q.handler("ok", retry_on=())  # no exception is retried: allowed


# -- args checked at enqueue ------------------------------------------------------------------
async def test_enqueue_checks_args_against_the_handler(queue: JobQueue) -> None:
    @queue.handler("resize")
    async def resize(ctx: JobContext, image: str, width: int, height: int = 0) -> None: ...

    before = await job_count(queue)
    with pytest.raises(InvalidJobError, match="missing argument 'width'"):
        await queue.enqueue("resize", {"image": "a.png"})
    with pytest.raises(InvalidJobError, match="unexpected argument 'widht'"):
        await resize.enqueue({"image": "a.png", "width": 1, "widht": 2})
    with pytest.raises(InvalidJobError, match="missing arguments 'image', 'width'"):
        await queue.enqueue(resize, {})
    with pytest.raises(InvalidJobError, match="unexpected argument 'ctx'"):
        await queue.enqueue("resize", {"ctx": 1, "image": "a", "width": 1})
    with pytest.raises(InvalidJobError, match="resize"):
        queue.batch().add(resize, {"image": "a.png"})
    assert await job_count(queue) == before
    ok = await resize.enqueue({"image": "a.png", "width": 10})
    assert (await queue.get(ok)).args == {"image": "a.png", "width": 10}


async def test_one_bad_job_in_a_batch_inserts_nothing(queue: JobQueue) -> None:
    @queue.handler("step")
    async def step(ctx: JobContext, n: int) -> None: ...

    before = await job_count(queue)
    with pytest.raises(InvalidJobError, match="missing argument 'n'"):
        async with queue.batch() as b:
            site = b.container("site")
            first = b.add(step, {"n": 1}, parent=site)
            b.add("step", {"m": 2}, parent=site, depends_on=[first])
    assert await job_count(queue) == before


async def test_a_type_without_a_local_handler_is_accepted(queue: JobQueue) -> None:
    """Another service may serve it: nothing to check it against here."""
    jid = await queue.enqueue("served_elsewhere", {"anything": [1, 2]})
    assert (await queue.get(jid)).state == JobState.READY


async def test_var_keyword_and_defaults_accept_what_they_should(queue: JobQueue) -> None:
    @queue.handler("loose")
    async def loose(ctx: JobContext, a: int, b: int = 2, **rest: Any) -> int:
        return a + b + len(rest)

    @queue.handler("star")
    async def star(*args: Any, name: str) -> str:  # ctx lands in *args
        return name

    ids = [await loose.enqueue({"a": 1}), await loose.enqueue({"a": 1, "b": 5, "x": 0, "y": 0}),
           await star.enqueue({"name": "s"})]
    with pytest.raises(InvalidJobError, match="missing argument 'a'"):
        await loose.enqueue({"x": 1})
    with pytest.raises(InvalidJobError, match="unexpected argument 'ctx'"):
        await loose.enqueue({"a": 1, "ctx": 2})  # ctx is passed by position already
    await queue.run_until_idle()
    assert [await queue.wait(i, timeout=10) for i in ids] == [3, 8, "s"]


async def test_a_wrapped_handler_is_checked_against_the_wrapped_signature(
    queue: JobQueue,
) -> None:
    def logged(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        async def wrapper(ctx: JobContext, **args: Any) -> Any:
            return await fn(ctx, **args)

        return wrapper

    @queue.handler("w")
    @logged
    async def w(ctx: JobContext, n: int) -> int:
        return n * 2

    with pytest.raises(InvalidJobError, match="unexpected argument 'm'"):
        await w.enqueue({"n": 1, "m": 1})
    jid = await w.enqueue({"n": 4})
    await queue.run_until_idle()
    assert await queue.wait(jid, timeout=10) == 8


async def test_periodic_schedules_are_checked_against_the_handler() -> None:
    q = JobQueue("sqlite:///unused.db")

    @q.handler("tick")
    async def tick(ctx: JobContext, n: int) -> None: ...

    with pytest.raises(InvalidJobError, match="missing argument 'n'"):
        q.periodic("every-minute", type="tick", every=60)
    q.periodic("ok", type="tick", args={"n": 1}, every=60)


# -- enqueue's id, b.add's ref ----------------------------------------------------------------
async def test_enqueue_returns_the_id_and_add_a_ref(queue: JobQueue) -> None:
    jid = await queue.enqueue("x", {})
    assert isinstance(jid, int) and not isinstance(jid, bool)
    async with queue.batch() as b:
        ref = b.add("x", {})
        with pytest.raises(InvalidJobError, match="no id yet"):
            ref.id  # noqa: B018 - the id exists only once the batch is inserted
    assert isinstance(ref.id, int) and ref.id > jid


# -- children take their container's group and weight -----------------------------------------
async def test_children_take_the_container_group_and_weight_in_one_batch(
    queue: JobQueue,
) -> None:
    async with queue.batch() as b:
        site = b.container("site", group="tenant-a", weight=3)
        plain = b.add("fetch", {}, parent=site)
        own = b.add("fetch", {}, parent=site, group="tenant-b", weight=2)
        half = b.add("fetch", {}, parent=site, group="tenant-c")
        inner = b.container("pages", parent=site)
        deep = b.add("fetch", {}, parent=inner, depends_on=[plain])
        outside = b.add("report", {}, depends_on=[site])
    got = {r: await queue.get(r.id) for r in (plain, own, half, inner, deep, outside)}
    assert (got[plain].group, got[plain].weight) == ("tenant-a", 3)
    assert (got[own].group, got[own].weight) == ("tenant-b", 2)
    assert (got[half].group, got[half].weight) == ("tenant-c", 3)
    assert (got[inner].group, got[inner].weight) == ("tenant-a", 3)
    assert (got[deep].group, got[deep].weight) == ("tenant-a", 3)
    assert (got[outside].group, got[outside].weight) == ("default", 1)


async def test_children_of_an_existing_container_take_its_group_and_weight(
    queue: JobQueue,
) -> None:
    async with queue.batch() as b:  # a child scheduled later keeps the container open
        site = b.container("site", group="tenant-a", weight=4)
        b.add("fetch", {}, parent=site, run_after=timedelta(hours=1))
    late = await queue.enqueue("fetch", {}, parent=site.id)
    async with queue.batch() as b:
        nested = b.container("more", parent=site.id)
        leaf = b.add("fetch", {}, parent=nested)
        mine = b.add("fetch", {}, parent=site.id, weight=1, group="tenant-z")
    for jid in (late, nested.id, leaf.id):
        job = await queue.get(jid)
        assert (job.group, job.weight) == ("tenant-a", 4), job
    assert ((await queue.get(mine.id)).group, (await queue.get(mine.id)).weight) == ("tenant-z", 1)


async def test_a_container_group_limit_holds_for_its_children(
    make_queue: Callable[..., JobQueue],
) -> None:
    """The README's own snippet: children of a tenant-a container obey tenant-a's cap."""
    q = make_queue(group_limits={"tenant-a": 1}, capacity=4)
    running = 0
    most = 0

    @q.handler("work")
    async def work(ctx: JobContext) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            await asyncio.sleep(0.05)
        finally:
            running -= 1

    async with q:
        async with q.batch() as b:
            site = b.container("site", group="tenant-a")
            for _ in range(4):
                b.add(work, {}, parent=site)
        await q.run_until_idle()
        assert (await q.get(site.id)).state == JobState.DONE
    assert most == 1

"""``JobQueue`` takes the URLs the command line takes (a plain ``postgresql://``,
``mysql://``, ``sqlite:///`` gets its async driver), and a method that needs the database
before ``async with queue`` says so with a RuntimeError."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from conftest import drop_tables
from sqlalchemy.engine import make_url

from aiojobqueue import ConfigurationError, JobQueue, JobState, NotStartedError
from aiojobqueue.dialects.urls import async_url


@pytest.mark.parametrize(("given", "used"), [
    ("sqlite:///jobs.db", "sqlite+aiosqlite:///jobs.db"),
    ("sqlite:////abs/path/jobs.db", "sqlite+aiosqlite:////abs/path/jobs.db"),
    ("sqlite://", "sqlite+aiosqlite://"),
    ("postgresql://u:p%40ss@db:5432/app?sslmode=require",
     "postgresql+asyncpg://u:p%40ss@db:5432/app?sslmode=require"),
    ("postgres://u@db/app", "postgresql+asyncpg://u@db/app"),
    ("mysql://root@db:3306/app", "mysql+aiomysql://root@db:3306/app"),
    ("mariadb://root@db/app", "mysql+aiomysql://root@db/app"),
    ("  sqlite:///jobs.db\n", "sqlite+aiosqlite:///jobs.db"),
    # a driver named is kept, whichever it is
    ("postgresql+asyncpg://u@db/app", "postgresql+asyncpg://u@db/app"),
    ("postgresql+psycopg://u@db/app", "postgresql+psycopg://u@db/app"),
    ("sqlite+aiosqlite:///x.db", "sqlite+aiosqlite:///x.db"),
    # a database aiojobqueue does not serve is left for SQLAlchemy to refuse
    ("oracle://u@db/app", "oracle://u@db/app"),
])
def test_async_url_adds_the_driver_a_plain_url_lacks(given: str, used: str) -> None:
    assert async_url(given) == used


@pytest.mark.parametrize("bad", ["jobs.db", "", "://nothing", "not a url"])
def test_a_string_that_is_no_url_is_a_configuration_error(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="bad database URL"):
        JobQueue(bad)


def plain_urls(db: str, db_url: str) -> list[str]:
    """The URL under test without its driver, in each spelling users write."""
    u = make_url(db_url)
    backend = u.get_backend_name()
    names = {"postgresql": ["postgresql", "postgres"], "mysql": ["mysql", "mariadb"],
             "sqlite": ["sqlite"]}[backend]
    return [u.set(drivername=n).render_as_string(hide_password=False) for n in names]


async def test_a_queue_on_a_plain_url_runs_jobs(db: str, db_url: str, prefix: str) -> None:
    urls = plain_urls(db, db_url)
    assert all("+" not in u.split("://")[0] for u in urls)
    try:
        for url in urls:
            q = JobQueue(url, prefix=prefix, poll_interval=0.05)

            @q.handler("add")
            async def add(ctx: Any, a: int, b: int) -> int:
                return a + b

            async with q:
                jid = await add.enqueue({"a": 2, "b": 3})
                await q.run_until_idle()
                assert await q.wait(jid, timeout=10) == 5
                assert (await q.get(jid)).state == JobState.DONE
    finally:
        if db != "sqlite":
            await drop_tables(db_url, prefix)


def _calls(q: JobQueue) -> dict[str, Callable[[], Awaitable[Any]]]:
    async def batch() -> None:
        async with q.batch() as b:
            b.add("x", {})

    return {
        "enqueue": lambda: q.enqueue("x", {}),
        "batch": batch,
        "get": lambda: q.get(1),
        "wait": lambda: q.wait(1, timeout=1),
        "cancel": lambda: q.cancel(1),
        "retry": lambda: q.retry(1),
    }


async def test_using_the_database_before_start_says_so(tmp_path: Any) -> None:
    q = JobQueue(f"sqlite:///{tmp_path}/never.db")
    for name, call in _calls(q).items():
        with pytest.raises(RuntimeError, match=r"not started.*async with queue") as ei:
            await call()
        assert isinstance(ei.value, NotStartedError), name
    with pytest.raises(NotStartedError, match="async with queue"):
        q.engine  # noqa: B018
    assert not (tmp_path / "never.db").exists()  # nothing connected, nothing created


async def test_a_closed_queue_says_so_too(queue: JobQueue) -> None:
    await queue.close()
    with pytest.raises(NotStartedError):
        await queue.enqueue("x", {})

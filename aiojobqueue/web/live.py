"""Live updates: one shared watcher per dashboard fans changes out to every open page.

The watcher reads the change marker (``Data.marker``: a few index probes) at most once per
``interval`` however many browsers are connected, and only while at least one is. Where the
dialect has a push listener (PostgreSQL LISTEN/NOTIFY, the MySQL/MariaDB bell: where jobs
became runnable; SQLite's watch of ``data_version``: any commit to the file) a wake-up
makes it look at once. It also polls every ``interval``, or only every ``push_backstop``
seconds where the listener hears every commit (SQLite).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ..dialects.base import Listener
from ..dialects.urls import dialect_for

if TYPE_CHECKING:
    from .data import Data

log = logging.getLogger("aiojobqueue.web")


class Hub:
    """Subscribers get the latest change number; the watcher runs while any subscribe."""

    def __init__(self, data: Data, interval: float = 1.0, push_backstop: float = 5.0) -> None:
        self.data = data
        self.interval = interval
        self.push_backstop = push_backstop
        self.version = 0
        #: How many times the marker was read (tests hold the "once a second" claim to it).
        self.reads = 0
        self._subs: set[asyncio.Queue[int]] = set()
        self._task: asyncio.Task[None] | None = None
        self._poke = asyncio.Event()
        #: Set once the watcher has its first marker: changes count from there.
        self._baseline = asyncio.Event()

    @property
    def subscribers(self) -> int:
        return len(self._subs)

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[asyncio.Queue[int]]:
        """A queue that receives the change number after each change (latest only). Entered
        once the watcher has its baseline, so a change made after that is never missed."""
        box: asyncio.Queue[int] = asyncio.Queue(maxsize=1)
        self._subs.add(box)
        if self._task is None or self._task.done():
            self._baseline.clear()
            self._task = asyncio.create_task(self._watch(), name="aiojobqueue-dashboard-live")
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._baseline.wait(), 10.0)
            yield box
        finally:
            self._subs.discard(box)
            if not self._subs and self._task is not None:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._task
                self._task = None

    async def close(self) -> None:
        """Stop the watcher (the app's shutdown)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    def _publish(self) -> None:
        self.version += 1
        for box in list(self._subs):
            if box.full():  # a slow page only needs the latest change
                with contextlib.suppress(asyncio.QueueEmpty):
                    box.get_nowait()
            box.put_nowait(self.version)

    async def _watch(self) -> None:
        listener = self._listener()
        push = (asyncio.create_task(listener.run(lambda _payload: self._poke.set()))
                if listener is not None else None)
        # a listener that hears every commit leaves only a slow backstop to poll for
        wait = self.push_backstop if listener is not None and listener.every_commit \
            else self.interval
        last: Any = None
        loop = asyncio.get_running_loop()
        try:
            while True:
                started = loop.time()
                try:
                    mark = await self.data.marker()
                    self.reads += 1
                    if last is not None and mark != last:
                        self._publish()
                    last = mark
                except Exception as exc:  # a database outage: keep the pages, retry
                    log.warning("dashboard live updates: reading the marker failed: %s", exc)
                self._baseline.set()
                self._poke.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._poke.wait(), wait)
                # never more than one read per interval, however many notifications arrive
                await asyncio.sleep(max(self.interval - (loop.time() - started), 0.0))
        finally:
            if push is not None:
                push.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await push

    def _listener(self) -> Listener | None:
        """The dialect's push listener, or None where only polling exists."""
        engine = self.data.q.engine
        return dialect_for(engine, self.data.t).listener(engine)

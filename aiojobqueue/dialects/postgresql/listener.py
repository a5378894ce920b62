"""PostgreSQL's push channel: LISTEN on a dedicated connection outside the pool."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from ..base import Listener, WakeCallback

log = logging.getLogger("aiojobqueue.listener")


class PgListener(Listener):
    """LISTEN on its own NullPool connection: never returned to a pool, never runs SQLAlchemy
    statements (a transaction left open there would hold back every notification)."""

    def __init__(self, engine: AsyncEngine, channel: str) -> None:
        self._url = engine.url
        self._channel = channel

    async def run(self, on_wake: WakeCallback) -> None:
        engine = create_async_engine(self._url, poolclass=NullPool)
        delay = 0.1
        try:
            while True:
                try:
                    await self._listen_once(engine, on_wake)
                    delay = 0.1
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # reconnect: polling covers the gap
                    log.warning("LISTEN connection lost (%s); reconnecting in %.1fs", exc, delay)
                    on_wake("")  # something may have happened while we were deaf
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
        finally:
            await engine.dispose()

    async def _listen_once(self, engine: AsyncEngine, on_wake: WakeCallback) -> None:
        conn = await engine.connect()
        try:
            raw = await conn.get_raw_connection()
            apg: Any = raw.driver_connection
            lost = asyncio.get_running_loop().create_future()

            def _on_notify(_c: Any, _pid: int, _ch: str, payload: str) -> None:
                on_wake(payload)

            def _on_close(_c: Any) -> None:
                if not lost.done():
                    lost.set_result(None)

            await apg.add_listener(self._channel, _on_notify)
            apg.add_termination_listener(_on_close)
            on_wake("")
            try:
                while not lost.done():
                    # is_closed() alone misses a silently dead socket: probe it now and then.
                    try:  # asyncio.timeout: 3.11's wait_for can swallow a cancellation
                        async with asyncio.timeout(30.0):
                            await asyncio.shield(lost)
                    except TimeoutError:
                        await apg.execute("SELECT 1")
                raise ConnectionError("listener connection closed")
            finally:
                if not apg.is_closed():
                    await apg.remove_listener(self._channel, _on_notify)
        finally:
            await conn.close()

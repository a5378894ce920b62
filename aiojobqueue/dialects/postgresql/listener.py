"""PostgreSQL's push channel: LISTEN on a dedicated connection outside the pool."""

from __future__ import annotations

import asyncio
import logging
import uuid

from sqlalchemy import func, select
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from ..base import Listener, WakeCallback
from .drivers import ListenLink, listen_link, pooled_args

log = logging.getLogger("aiojobqueue.listener")

#: seconds the listener waits for its own NOTIFY before it concludes none will come
PROBE_WAIT = 5.0


class Deafness:
    """Whether a queue's listener already said that notifications do not arrive (shared by
    the listeners of one queue, so the warning comes once)."""

    def __init__(self) -> None:
        self.warned = False


class PgListener(Listener):
    """LISTEN on a connection of its own: never returned to a pool, never runs SQLAlchemy
    statements (a transaction left open there would hold back every notification).

    Without ``listen_url`` the connection is made by ``engine`` itself and then detached
    from its pool (``PoolProxiedConnection.detach``: closing it closes it), so it connects
    as every other connection of the queue does: the engine's ``connect_args`` (SSL,
    ``server_settings``), its URL's options, a ``creator`` and its connect hooks. With
    ``listen_url`` (a direct connection when ``engine`` goes through a transaction pooler)
    it connects there through a NullPool engine of its own, with the options that URL
    carries in its query. Once listening it sends itself
    a NOTIFY through ``engine``; if that does not come back within PROBE_WAIT seconds (a
    transaction pooler passes LISTEN to some server connection and never forwards what it
    receives), it logs one warning and returns: the worker polls."""

    def __init__(self, engine: AsyncEngine, channel: str, listen_url: URL | None,
                 deaf: Deafness) -> None:
        self._engine = engine
        self._listen_url = listen_url
        self._url = listen_url or engine.url
        self._channel = channel
        self._deaf = deaf

    async def run(self, on_wake: WakeCallback) -> None:
        own: AsyncEngine | None = None
        if self._listen_url is not None:
            # its statements are the dialect's first-connect queries, LISTEN and SELECT 1:
            # no cache is worth keeping, and none may outlive its transaction behind a pooler
            own = create_async_engine(
                self._listen_url, poolclass=NullPool,
                connect_args=pooled_args(self._listen_url.get_driver_name()))
        delay = 0.1
        try:
            while True:
                try:
                    if not await self._listen_once(own, on_wake):
                        return
                    delay = 0.1
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # reconnect: polling covers the gap
                    log.warning("LISTEN connection lost (%s); reconnecting in %.1fs", exc, delay)
                    on_wake("")  # something may have happened while we were deaf
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
        finally:
            if own is not None:
                await own.dispose()

    async def _probe(self, came: asyncio.Future[None], payload: str) -> bool:
        """Send ``payload`` on the channel through the queue's engine (the path every other
        worker's NOTIFY takes) and wait for it to come back."""
        async with self._engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(select(func.pg_notify(self._channel, payload)))
        try:
            async with asyncio.timeout(PROBE_WAIT):
                await asyncio.shield(came)
        except TimeoutError:
            return False
        return True

    async def _listen_once(self, own: AsyncEngine | None, on_wake: WakeCallback) -> bool:
        """Listen until the connection is lost (raises); False if notifications do not
        arrive on it. ``own``: the listen_url's engine, else None (the queue's engine)."""
        conn = await (own or self._engine).connect()
        link: ListenLink | None = None
        try:
            raw = await conn.get_raw_connection()
            driver_conn = raw.driver_connection  # (detach() forgets it)
            if own is None:
                # out of the queue's pool at once (its slot reconnects when next needed):
                # this connection stays LISTENing, and closing it below ends it
                raw.detach()
            loop = asyncio.get_running_loop()
            came = loop.create_future()
            probe = f"ajq-probe:{uuid.uuid4().hex}"

            def _on_notify(payload: str) -> None:
                if payload == probe:
                    if not came.done():
                        came.set_result(None)
                else:
                    on_wake(payload)

            link = listen_link(driver_conn, self._channel, _on_notify)
            await link.start()
            on_wake("")
            try:
                if not await self._probe(came, probe):
                    if not self._deaf.warned:
                        self._deaf.warned = True
                        log.warning(
                            "notifications on %s do not arrive (its own NOTIFY did not come "
                            "back within %.0fs: a transaction pooler such as PgBouncer?); "
                            "workers poll every poll_interval instead. Give "
                            "JobQueue(listen_url=...) a direct connection to be woken at once",
                            self._url.render_as_string(hide_password=True), PROBE_WAIT)
                    return False
                while not link.lost.done():
                    # a closed-connection callback alone misses a silently dead socket:
                    # probe it now and then.
                    try:  # asyncio.timeout: 3.11's wait_for can swallow a cancellation
                        async with asyncio.timeout(30.0):
                            await asyncio.shield(link.lost)
                    except TimeoutError:
                        await link.ping()
                raise ConnectionError("listener connection closed")
            finally:
                await link.stop()
        finally:
            try:
                await conn.close()
            finally:
                if own is None and link is not None:
                    # detached: SQLAlchemy's close may leave the driver's connection open
                    # (psycopg warns when it is collected so)
                    await link.close()

"""A small asyncio TCP proxy for simulating database outages in tests.

Put it between a queue and PostgreSQL/MariaDB (``proxy.url(db_url)``) and then:

* ``cut()``         abort every live connection (both directions, like a dead network);
* ``refuse()``      close new connections at once until ``allow()`` (server unreachable);
* ``outage(s)``     cut, refuse for ``s`` seconds, allow again;
* ``cut_after_commit(marker)``: on the connection whose client bytes next contain
  ``marker``, let the following COMMIT reach the server, wait for the server's answer, drop
  it and abort the connection: the transaction is committed but the client never learns
  (the "ambiguous commit" case). With ``autocommit=True`` the statement carrying the
  marker is its own commit: the answer to it is the one lost.
* ``cut_after_statement(sql)`` (PostgreSQL): the same for the next execution of a prepared
  statement whose SQL text contains ``sql``, run in autocommit (its answer is its commit's).
  The proxy reads the protocol's Parse / Bind messages to know which statement runs.

Only this proxy's connections are affected: other users of the servers see nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from sqlalchemy.engine import make_url

log = logging.getLogger("tests.tcpproxy")


class _Pair:
    def __init__(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter,
                 sr: asyncio.StreamReader, sw: asyncio.StreamWriter) -> None:
        self.cr, self.cw, self.sr, self.sw = cr, cw, sr, sw
        self.tasks: list[asyncio.Task[None]] = []
        self.armed = False        # saw the marker: the next COMMIT is the one to lose
        self.commit_sent = False  # the COMMIT went to the server: drop its answer, then abort
        self.pg = _PgScan()

    def abort(self) -> None:
        for w in (self.cw, self.sw):
            with contextlib.suppress(Exception):
                w.transport.abort()


class _PgScan:
    """Client -> server PostgreSQL messages: which statement texts are being executed."""

    def __init__(self) -> None:
        self.buf = b""
        self.started = False
        self.names: dict[bytes, bytes] = {}  # prepared statement name -> SQL text

    def feed(self, data: bytes) -> list[bytes]:
        """SQL texts executed (Bind of a prepared statement, or a simple Query) in ``data``."""
        self.buf += data
        out: list[bytes] = []
        while True:
            if not self.started:  # untyped startup / SSLRequest: int32 length, int32 code
                if len(self.buf) < 8:
                    return out
                n, code = int.from_bytes(self.buf[:4], "big"), int.from_bytes(self.buf[4:8], "big")
                if len(self.buf) < n:
                    return out
                self.buf = self.buf[n:]
                self.started = code != 80877103  # SSLRequest: the real startup follows
                continue
            if len(self.buf) < 5:
                return out
            kind, n = self.buf[:1], int.from_bytes(self.buf[1:5], "big")
            if len(self.buf) < 1 + n:
                return out
            body, self.buf = self.buf[5 : 1 + n], self.buf[1 + n :]
            if kind == b"P":
                name, rest = body.split(b"\0", 1)
                self.names[name] = rest.split(b"\0", 1)[0]
            elif kind == b"B":
                name = body.split(b"\0", 2)[1]
                out.append(self.names.get(name, b""))
            elif kind == b"Q":
                out.append(body)


class TcpProxy:
    """Forward 127.0.0.1:<port> to ``target_host:target_port``."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._pairs: set[_Pair] = set()
        self._refusing = False
        self._marker: bytes | None = None
        self._autocommit = False
        self._sql_marker: bytes | None = None
        self.postgres = False  # speaks the PostgreSQL protocol (set by for_url)
        self.ambiguous_commits = 0
        self.cuts = 0
        self.events: list[tuple[float, str]] = []

    @classmethod
    def for_url(cls, url: str) -> TcpProxy:
        u = make_url(url)
        pg = u.get_backend_name() == "postgresql"
        px = cls(u.host or "127.0.0.1", u.port or (5432 if pg else 3306))
        px.postgres = pg
        return px

    def url(self, url: str) -> str:
        """``url`` rewritten to go through this proxy."""
        u = make_url(url).set(host="127.0.0.1", port=self.port)
        return u.render_as_string(hide_password=False)

    def _event(self, what: str) -> None:
        self.events.append((time.time(), what))
        log.warning("proxy: %s", what)

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def __aenter__(self) -> TcpProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- faults -------------------------------------------------------------------------
    def cut(self) -> int:
        """Abort every live connection. Returns how many were cut."""
        n = len(self._pairs)
        for p in list(self._pairs):
            p.abort()
        self._pairs.clear()
        self.cuts += 1
        self._event(f"cut {n} connection(s)")
        return n

    def refuse(self) -> None:
        self._refusing = True
        self._event("refusing new connections")

    def allow(self) -> None:
        self._refusing = False
        self._event("accepting connections again")

    async def outage(self, seconds: float) -> None:
        """The database is unreachable for ``seconds``."""
        self.refuse()
        self.cut()
        await asyncio.sleep(seconds)
        self.allow()

    def cut_after_commit(self, marker: bytes, autocommit: bool = False) -> None:
        """Lose the answer to the COMMIT of the next transaction that sends ``marker`` (with
        ``autocommit``: to the statement that sends it, which commits by itself)."""
        self._marker = marker
        self._autocommit = autocommit

    def cut_after_statement(self, sql: bytes) -> None:
        """PostgreSQL: lose the answer to the next execution of a statement whose SQL text
        contains ``sql`` (it must run in autocommit: the answer is its commit's)."""
        self._sql_marker = sql

    # -- plumbing -----------------------------------------------------------------------
    async def _accept(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        if self._refusing:
            cw.transport.abort()
            return
        try:
            sr, sw = await asyncio.open_connection(*self.target)
        except OSError:
            cw.transport.abort()
            return
        pair = _Pair(cr, cw, sr, sw)
        self._pairs.add(pair)
        pair.tasks = [
            asyncio.create_task(self._pump_up(pair)),
            asyncio.create_task(self._pump_down(pair)),
        ]

    async def _pump_up(self, p: _Pair) -> None:
        """Client -> server, watching for the marker and the COMMIT after it."""
        try:
            while data := await p.cr.read(65536):
                if self._marker is not None and self._marker in data:
                    self._marker = None
                    p.armed = True
                    if self._autocommit:
                        p.armed, p.commit_sent = False, True
                if self.postgres:  # track every statement: it may be armed later
                    run = p.pg.feed(data)
                    if self._sql_marker is not None and any(self._sql_marker in q for q in run):
                        self._sql_marker = None
                        p.commit_sent = True
                if p.armed and b"COMMIT" in data:
                    p.armed = False
                    p.commit_sent = True
                p.sw.write(data)
                await p.sw.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._drop(p)

    async def _pump_down(self, p: _Pair) -> None:
        try:
            while data := await p.sr.read(65536):
                if p.commit_sent:  # the server answered the COMMIT: it is durable; lose it
                    self.ambiguous_commits += 1
                    self._event("COMMIT answered by the server; answer dropped, connection cut")
                    break
                p.cw.write(data)
                await p.cw.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._drop(p)

    def _drop(self, p: _Pair) -> None:
        p.abort()
        self._pairs.discard(p)

"""Hosts on one machine for tests and benchmarks: Linux network namespaces on a bridge, and a
TCP forwarder on the bridge's address in front of a server that listens on 127.0.0.1 only.
Needs root and iproute2 (``ip netns``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import threading
import uuid


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", *args] if ns is None else ["ip", "netns", "exec", ns, "ip", *args]
    subprocess.run(cmd, check=True, capture_output=True, timeout=10)


class Net:
    """A bridge 10.231.N.1/24 and HOSTS namespaces at .10, .11, ... on it."""

    def __init__(self, hosts: int) -> None:
        tag = uuid.uuid4().hex[:6]
        self.subnet = f"10.231.{random.randint(1, 250)}"
        self.bridge = f"ajqb{tag}"
        self.ns = [f"ajqh{tag}{i}" for i in range(hosts)]
        self.veth = [f"ajqv{tag}{i}" for i in range(hosts)]
        self.gateway = f"{self.subnet}.1"

    def up(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, (ns, veth) in enumerate(zip(self.ns, self.veth, strict=True)):
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
            _ip("link", "set", f"{veth}p", "netns", ns)
            _ip("link", "set", veth, "master", self.bridge)
            _ip("link", "set", veth, "up")
            _ip("addr", "add", f"{self.subnet}.{10 + i}/24", "dev", f"{veth}p", ns=ns)
            _ip("link", "set", f"{veth}p", "up", ns=ns)
            _ip("link", "set", "lo", "up", ns=ns)

    def pids(self, i: int) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.ns[i]], capture_output=True,
                             text=True, timeout=10).stdout
        return [int(p) for p in out.split()]

    def kill_host(self, i: int) -> list[int]:
        pids = self.pids(i)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def cut(self, i: int) -> None:
        _ip("link", "set", self.veth[i], "down")

    def heal(self, i: int) -> None:
        _ip("link", "set", self.veth[i], "up")

    def down(self) -> None:
        for i in range(len(self.ns)):
            with contextlib.suppress(Exception):
                self.kill_host(i)
        for ns in self.ns:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        for veth in self.veth:
            subprocess.run(["ip", "link", "del", veth], capture_output=True, timeout=10)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=10)


class Forwarder:
    """TCP from ``listen`` (the bridge address) to the server, on a thread of its own."""

    def __init__(self, listen: str, target: tuple[str, int]) -> None:
        self.listen, self.target = listen, target
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Forwarder:
        self._thread.start()
        self._ready.wait(10)
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def pump(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except OSError:
                pass
            finally:
                w.close()

        async def accept(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
            try:
                sr, sw = await asyncio.open_connection(*self.target)
            except OSError:
                cw.close()
                return
            await asyncio.gather(pump(cr, sw), pump(sr, cw))

        async def main() -> None:
            server = await asyncio.start_server(accept, self.listen, 0)
            self.port = server.sockets[0].getsockname()[1]
            self._ready.set()
            async with server:
                await server.serve_forever()

        with contextlib.suppress(asyncio.CancelledError, RuntimeError):
            self._loop.run_until_complete(main())

    def stop(self) -> None:
        def cancel_all() -> None:
            for t in asyncio.all_tasks(self._loop):
                t.cancel()

        self._loop.call_soon_threadsafe(cancel_all)
        self._thread.join(10)

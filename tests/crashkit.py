"""Helpers for the crash tests: a fleet of worker processes (tests/crashworker.py) sharing
one database and one timestamped event log, plus the log's analysis."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest_asyncio

WORKER = Path(__file__).with_name("crashworker.py")
Event = dict[str, Any]


class Fleet:
    """Worker processes of one test. Every process appends to ``log``; the test appends its
    own ``kill`` / ``term`` / ``note`` events to the same file, so one timeline holds all."""

    def __init__(self, url: str, prefix: str, tmp: Path, **opts: Any) -> None:
        self.url, self.prefix, self.tmp = url, prefix, tmp
        self.log = tmp / "events.jsonl"
        self.log.touch()
        self.opts = {"ttl": 2.0, "hb": 0.4, "poll": 0.05, "shutdown_timeout": 2.0,
                     "capacity": 4, **opts}
        self.procs: list[subprocess.Popen[bytes]] = []
        self._fd = os.open(self.log, os.O_WRONLY | os.O_APPEND)

    def note(self, ev: str, **kw: Any) -> None:
        rec = {"t": time.time(), "pid": os.getpid(), "ev": ev, **kw}
        os.write(self._fd, (json.dumps(rec) + "\n").encode())

    def spawn(self, **opts: Any) -> subprocess.Popen[bytes]:
        o = {**self.opts, **opts}
        n = len(self.procs)
        err = open(self.tmp / f"worker{n}.log", "wb")  # noqa: SIM115 - lives with the process
        cmd = [sys.executable, str(WORKER), self.url, self.prefix, str(self.log)]
        for k, v in o.items():
            cmd += [f"--{k.replace('_', '-')}", str(v)]
        p = subprocess.Popen(cmd, stdout=err, stderr=subprocess.STDOUT)
        err.close()
        self.procs.append(p)
        self.note("spawn", child=p.pid)
        return p

    def kill(self, p: subprocess.Popen[bytes]) -> None:
        """SIGKILL: no shutdown, no release, nothing written. The event's time is taken once
        the process is gone: noted before the signal, an event the worker logged in between
        would seem to come after its death."""
        p.kill()
        p.wait()
        self.note("kill", child=p.pid)

    def term(self, p: subprocess.Popen[bytes]) -> None:
        self.note("term", child=p.pid)
        p.send_signal(signal.SIGTERM)

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def events(self, ev: str | None = None, **match: Any) -> list[Event]:
        out = []
        with open(self.log) as f:
            for line in f:
                if not line.strip():
                    continue
                e = json.loads(line)
                if (ev is None or e["ev"] == ev) and all(e.get(k) == v for k, v in match.items()):
                    out.append(e)
        return out

    async def wait_for(self, ev: str, timeout: float = 30.0, **match: Any) -> Event:
        """The first event ``ev`` matching ``match``; fail after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.events(ev, **match)
            if got:
                return got[0]
            if time.monotonic() > deadline:
                raise AssertionError(f"no {ev} {match} within {timeout}s\n{self.dump()}")
            await asyncio.sleep(0.05)

    async def start_one(self, **opts: Any) -> subprocess.Popen[bytes]:
        """Spawn a worker and wait until it serves."""
        p = self.spawn(**opts)
        await self.ready(p)
        return p

    async def ready(self, p: subprocess.Popen[bytes], timeout: float = 30.0) -> Event:
        return await self.wait_for("ready", timeout, pid=p.pid)

    def dump(self, lines: int = 60) -> str:
        parts = [f"--- events ({self.log}) ---", *self.log.read_text().splitlines()[-lines:]]
        for i in range(len(self.procs)):
            f = self.tmp / f"worker{i}.log"
            if f.exists():
                parts += [f"--- {f.name} ---", *f.read_text(errors="replace").splitlines()[-25:]]
        return "\n".join(parts)

    def worker_logs(self) -> str:
        return "\n".join((self.tmp / f"worker{i}.log").read_text(errors="replace")
                         for i in range(len(self.procs)))

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        os.close(self._fd)


@pytest_asyncio.fixture
async def fleet_factory(db_url: str, prefix: str, tmp_path: Path
                        ) -> AsyncIterator[Callable[..., Fleet]]:
    made: list[Fleet] = []

    def make(**opts: Any) -> Fleet:
        f = Fleet(db_url, prefix, tmp_path, **opts)
        made.append(f)
        return f

    yield make
    for f in made:
        f.close()


def by_job(events: list[Event]) -> dict[int, list[Event]]:
    out: dict[int, list[Event]] = defaultdict(list)
    for e in events:
        if "job" in e:
            out[e["job"]].append(e)
    return out

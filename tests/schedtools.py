"""Helpers for the multi-process scheduling tests: spawn workers, read their interval logs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC
from pathlib import Path
from typing import Any

from conftest import eventually
from sqlalchemy import select

from aiojobqueue import JobQueue, JobState

WORKER = str(Path(__file__).with_name("sched_worker.py"))


def spawn(url: str, prefix: str, log: Path, *opts: str) -> subprocess.Popen[str]:
    """Start one worker process; returns once it has connected (printed ``ready``)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    p = subprocess.Popen(
        [sys.executable, WORKER, url, prefix, str(log), *opts],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )
    return p


def wait_ready(procs: list[subprocess.Popen[str]], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline()  # blocks until the worker prints; it always prints first
        if line.strip() != "ready":
            raise AssertionError(f"worker {p.pid} did not start (exit {p.poll()})")
        if time.monotonic() > deadline:
            raise AssertionError("workers too slow to start")


def stop(procs: list[subprocess.Popen[str]], timeout: float = 30.0) -> None:
    """SIGTERM (graceful shutdown) every worker still alive and reap them all."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        if p.stdout is not None:
            p.stdout.close()


def read_log(log: Path) -> list[dict[str, Any]]:
    """The complete lines of a JSON-lines log that live processes may still be appending
    to: a last line without its newline is still being written, so it is left out."""
    if not log.exists():
        return []
    lines = log.read_text().split("\n")[:-1]  # the part after the last newline is unfinished
    return [json.loads(line) for line in lines if line.strip()]


def max_overlap(rows: list[dict[str, Any]]) -> int:
    """The most intervals [start, end) open at one instant (an end before a start at a tie)."""
    events = sorted([(r["start"], 1) for r in rows] + [(r["end"], -1) for r in rows])
    best = cur = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


async def all_done(q: JobQueue, ids: list[int]) -> bool:
    """Every job of ``ids`` is done."""
    J = q._t.jobs

    async def count(conn: Any) -> int:
        return len((await conn.execute(
            select(J.c.id).where(J.c.id.in_(ids), J.c.state == JobState.DONE.value))).all())

    return await q._read(count) == len(ids)


async def leases_of(q: JobQueue, pid: int) -> list[tuple[str, float]]:
    """(state, lease expiry as wall clock) of the running and held (leased) rows of worker
    process ``pid``."""
    J, W = q._t.jobs, q._t.workers

    async def read(conn: Any) -> list[Any]:
        owner = select(W.c.id).where(W.c.pid == pid).scalar_subquery()
        return list(await conn.execute(select(J.c.state, J.c.lease_expires).where(
            J.c.state.in_([JobState.RUNNING.value, JobState.LEASED.value]),
            J.c.lease_owner == owner)))

    return [(r[0], (r[1] if r[1].tzinfo else r[1].replace(tzinfo=UTC)).timestamp())
            for r in await q._read(read)]


async def kill_and_drain(q: JobQueue, victim: subprocess.Popen[str], ids: list[int],
                         timeout: float) -> tuple[float, list[tuple[str, float]]]:
    """SIGKILL ``victim`` mid-run, then wait until the others (and the reclaim of its
    leases) have finished every job of ``ids``: when it was killed, and its leases as
    leases_of read them right after (what the cap counts until they expire)."""
    killed_at = time.time()
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    dead = await leases_of(q, victim.pid)
    await eventually(lambda: all_done(q, ids), timeout=timeout, every=0.2)
    return killed_at, dead

"""A worker process for the crash tests: ``python tests/crashworker.py URL PREFIX LOG [opts]``.

It serves with ``aiojobqueue.runner.run_worker`` (so SIGTERM/SIGINT shut it down gracefully)
and appends one JSON line per event to LOG, with a wall-clock timestamp, its pid and worker id:
``ready`` / ``exit`` (the process), ``start`` / ``end`` / ``cancelled`` (inside a handler) and
``fin`` / ``discarded`` / ``released`` / ``failed`` / ``cancel_fin`` (what the worker's fenced
finalize reported). Lines are written with one ``os.write`` on an O_APPEND descriptor, so lines
of several processes never interleave and a SIGKILL never leaves half a line.

Handlers (args in brackets):
  sleep [seconds]          sleep in small steps; returns {"job", "attempt", "pid"}
  suicide                  SIGKILL its own worker process (every attempt)
  block [seconds, on_attempt=1]  time.sleep (blocks the event loop) on that attempt only
  die_after_end            returns, but the process is SIGKILLed before it can finalize
                           (attempt 1 only)
  chaos [ms]               sleep ms milliseconds; returns its dependencies' (job, attempt)
  spin [seconds]           a plain ``def``: spins in pure Python (holds the GIL) in a worker
                           thread, reporting progress from the thread every 0.2 s
  plain_sleep [seconds]    a plain ``def``: time.sleep in a worker thread; logs ``thread_end``
                           when the thread returns (also after its attempt timed out)

``--split N`` lowers the least part of a wide fan-out released by its finalize (PostgreSQL's
split release, see fanout.SPLIT), and each split is logged as a ``split`` event;
``--stall-rest`` leaves the rest of each split unreleased by this process (as if it died
right after the finalize), for another worker's sweep to finish.

``--retention JSON`` declares a retention (``{"done": seconds, ...}``); ``--sweep-every``,
``--sweep-ttl``, ``--sweep-batch``, ``--sweep-pause`` set the sweep's pace, and each committed
batch of the sweep is logged as a ``swept`` event with its ids.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from aiojobqueue import JobContext, JobEvent, JobQueue, fanout, retention
from aiojobqueue.claim import Claimer
from aiojobqueue.fanout import SplitReleases
from aiojobqueue.runner import run_worker
from aiojobqueue.threads import ThreadContext

_fd = -1
_wid = ""


def event(ev: str, **kw: Any) -> None:
    rec = {"t": time.time(), "pid": os.getpid(), "w": _wid, "ev": ev, **kw}
    os.write(_fd, (json.dumps(rec) + "\n").encode())


def build(args: argparse.Namespace) -> JobQueue:
    q = JobQueue(
        args.url, prefix=args.prefix, lease_ttl=args.ttl, heartbeat_interval=args.hb,
        poll_interval=args.poll, shutdown_timeout=args.shutdown_timeout, capacity=args.capacity,
        retry_backoff=0.01, retry_backoff_max=0.05,
        retention=json.loads(args.retention) if args.retention else None,
    )
    if args.sweep_every:  # the retention sweep's pace (test_retention_procs.py)
        retention.EVERY, retention.TTL = args.sweep_every, args.sweep_ttl
        retention.BATCH, retention.PAUSE = args.sweep_batch, args.sweep_pause

        class Swept(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                if hasattr(record, "ids"):
                    event("swept", ids=record.ids)

        lg = logging.getLogger("aiojobqueue.retention")
        lg.addHandler(Swept())
        lg.setLevel(logging.DEBUG)

    def result(ctx: JobContext, **extra: Any) -> dict[str, Any]:
        return {"job": ctx.job_id, "attempt": ctx.attempt, "pid": os.getpid(), **extra}

    @q.handler("sleep")
    async def sleep(ctx: JobContext, seconds: float = 0.0) -> dict[str, Any]:
        event("start", job=ctx.job_id, attempt=ctx.attempt)
        try:
            end = time.monotonic() + seconds
            while (left := end - time.monotonic()) > 0:  # noqa: ASYNC110 - a timed job
                await asyncio.sleep(min(left, 0.05))
        except asyncio.CancelledError:
            event("cancelled", job=ctx.job_id, attempt=ctx.attempt)
            raise
        event("end", job=ctx.job_id, attempt=ctx.attempt)
        return result(ctx)

    @q.handler("suicide")
    async def suicide(ctx: JobContext) -> None:
        event("start", job=ctx.job_id, attempt=ctx.attempt)
        os.kill(os.getpid(), signal.SIGKILL)

    @q.handler("block")
    async def block(ctx: JobContext, seconds: float, on_attempt: int = 1) -> dict[str, Any]:
        event("start", job=ctx.job_id, attempt=ctx.attempt)
        if ctx.attempt == on_attempt:
            time.sleep(seconds)  # noqa: ASYNC251 - freezes the event loop on purpose
        event("end", job=ctx.job_id, attempt=ctx.attempt)
        return result(ctx)

    @q.handler("die_after_end")
    async def die_after_end(ctx: JobContext) -> dict[str, Any]:
        event("start", job=ctx.job_id, attempt=ctx.attempt)
        if ctx.attempt == 1:
            # runs before the flusher can write the outcome: the process dies holding a
            # finished but unrecorded job
            asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGKILL)
        event("end", job=ctx.job_id, attempt=ctx.attempt)
        return result(ctx)

    @q.handler("chaos")
    async def chaos(ctx: JobContext, ms: int) -> dict[str, Any]:
        event("start", job=ctx.job_id, attempt=ctx.attempt)
        got = await ctx.dependency_results()
        await asyncio.sleep(ms / 1000)
        event("end", job=ctx.job_id, attempt=ctx.attempt)
        # (a run condition's job also sees failed or cancelled dependencies: no result)
        return result(ctx, deps={str(k): [v["job"], v["attempt"]] for k, v in got.items()
                                 if v is not None})

    @q.handler("spin")
    def spin(ctx: ThreadContext, seconds: float) -> dict[str, Any]:
        event("start", job=ctx.job_id, attempt=ctx.attempt)
        end = time.monotonic() + seconds
        next_report, n = 0.0, 0
        while (now := time.monotonic()) < end:
            n += 1  # pure Python: the GIL is only given up at each switch interval
            if now >= next_report:
                ctx.progress(seconds - (end - now), seconds)
                next_report = now + 0.2
        event("end", job=ctx.job_id, attempt=ctx.attempt)
        return result(ctx, spins=n)

    @q.handler("plain_sleep")
    def plain_sleep(ctx: ThreadContext, seconds: float) -> dict[str, Any]:
        event("start", job=ctx.job_id, attempt=ctx.attempt)
        time.sleep(seconds)
        event("thread_end", job=ctx.job_id, attempt=ctx.attempt)
        return result(ctx)

    def hook(name: str) -> Any:
        def fn(e: JobEvent) -> None:
            event(name, job=e.job_id, attempt=e.attempt)
        return fn

    # the jobs a finalize call leased along (PostgreSQL's riding claim), for test_chaos
    real_asked = Claimer.asked_claims

    def asked(self: Claimer, ask: Any) -> Any:
        got = real_asked(self, ask)
        if got:
            event("rode", jobs=[c.id for c in got])
        return got

    Claimer.asked_claims = asked  # type: ignore[method-assign]

    if args.split:
        fanout.SPLIT = args.split
    real_rest = SplitReleases.release_rest

    def rest(self: SplitReleases) -> None:
        event("split")
        if not args.stall_rest:
            real_rest(self)

    SplitReleases.release_rest = rest  # type: ignore[method-assign]
    if args.stall_rest:  # nor does its reclaimer's sweep take the part

        async def no_rest(self: SplitReleases, n: int = 8) -> int:
            return 0

        SplitReleases.rest_releases = no_rest  # type: ignore[method-assign]

    # "retry" and "failed" both end an attempt in failure (attempts left, or not)
    for name, ev in (("done", "fin"), ("discarded", "discarded"), ("released", "released"),
                     ("retry", "failed"), ("failed", "failed"), ("cancelled", "cancel_fin")):
        q.on(name, hook(ev))
    return q


async def main() -> None:
    global _fd, _wid
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("prefix")
    ap.add_argument("log")
    ap.add_argument("--ttl", type=float, default=2.0)
    ap.add_argument("--hb", type=float, default=0.4)
    ap.add_argument("--poll", type=float, default=0.05)
    ap.add_argument("--shutdown-timeout", type=float, default=2.0)
    ap.add_argument("--capacity", type=int, default=4)
    ap.add_argument("--split", type=int, default=0)
    ap.add_argument("--stall-rest", type=int, default=0)
    ap.add_argument("--retention", default="")
    ap.add_argument("--sweep-every", type=float, default=0.0)
    ap.add_argument("--sweep-ttl", type=float, default=2.0)
    ap.add_argument("--sweep-batch", type=int, default=100)
    ap.add_argument("--sweep-pause", type=float, default=0.05)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s [{os.getpid()}] %(name)s %(levelname)s %(message)s")
    _fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    q = build(args)
    _wid = q.worker_id
    await q.start()
    event("ready")
    try:
        await run_worker(q)
    finally:
        await q.close()
        event("exit")


if __name__ == "__main__":
    asyncio.run(main())

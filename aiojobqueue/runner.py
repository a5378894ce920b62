"""Run a queue's worker until SIGTERM/SIGINT, then shut down gracefully."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .queue import JobQueue

log = logging.getLogger("aiojobqueue")


async def run_worker(queue: JobQueue) -> None:
    """``await queue.serve()`` until SIGTERM or SIGINT arrives; then stop claiming, let running
    jobs finish within ``shutdown_timeout``, cancel and release the rest, and return.

    A second signal during that grace period cuts it short: running jobs are cancelled and
    released at once (they are still released, not abandoned to lease expiry)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    serving = asyncio.ensure_future(queue.serve())

    signals = 0

    def stop(signame: str) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            log.info("%s received: shutting down gracefully", signame)
            serving.cancel()
            return
        worker = queue._worker
        if worker is not None:
            log.info("%s received again: releasing running jobs now", signame)
            worker.hurry()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop, sig.name)
    try:
        await serving
    except asyncio.CancelledError:
        if task.cancelling():
            raise
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)

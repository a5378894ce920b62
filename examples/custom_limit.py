"""A custom Limit: start a job only while enough GPU memory is free.

    python examples/custom_limit.py

A Limit answers "how many more jobs may start right now?" (``available()``) and hears about
this process's starts and finishes (``on_start`` / ``on_finish``). The worker never claims
more than the minimum over its limits, the global ``concurrency`` and its own ``capacity``.
Here the "GPU" is simulated; a real one would ask the driver (e.g. pynvml's
``nvmlDeviceGetMemoryInfo(handle).free``) in ``available()``.

Custom limits are checked by each process before it claims. For a budget that must hold
across the whole fleet exactly, count it in the database like ``RateLimit`` does.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from aiojobqueue import JobContext, JobQueue, Limit


class GpuMemory(Limit):
    """Each job needs ``per_job_mb`` of GPU memory; start jobs only while that much is free."""

    def __init__(self, total_mb: int, per_job_mb: int) -> None:
        self.free_mb, self.per_job_mb = total_mb, per_job_mb

    async def available(self) -> int:
        return max(self.free_mb // self.per_job_mb, 0)

    def on_start(self, job_type: str, group: str) -> None:
        self.free_mb -= self.per_job_mb

    def on_finish(self, job_type: str, group: str) -> None:
        self.free_mb += self.per_job_mb


async def main() -> None:
    db = Path(tempfile.mkdtemp()) / "gpu.db"
    gpu = GpuMemory(total_mb=2500, per_job_mb=1000)  # room for 2 jobs at a time
    queue = JobQueue(f"sqlite+aiosqlite:///{db}", capacity=8, limits=[gpu], poll_interval=0.1)
    t0 = time.monotonic()
    live = peak = 0

    @queue.handler("infer")
    async def infer(ctx: JobContext, n: int) -> int:
        nonlocal live, peak
        live += 1
        peak = max(peak, live)
        print(f"{time.monotonic() - t0:5.2f}s  start job {n}  ({live} on the GPU, "
              f"{gpu.free_mb} MB free)")
        await asyncio.sleep(0.3)
        live -= 1
        return n * n

    async with queue:
        async with queue.batch() as b:
            refs = [b.add("infer", {"n": n}) for n in range(6)]
        await queue.run_until_idle()
        results = [await queue.wait(r.id) for r in refs]
    print(f"results {results}; at most {peak} jobs ran at once (capacity was 8)")
    assert peak == 2


if __name__ == "__main__":
    asyncio.run(main())

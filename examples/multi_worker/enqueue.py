"""Enqueue N render jobs split over two groups, then wait for them and show who ran what.

    python enqueue.py 40
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter

from jobs import queue


async def main(n: int) -> None:
    async with queue:  # creates the schema if needed (or run `aiojobqueue migrate` first)
        async with queue.batch() as b:
            refs = [b.add("render", {"n": i}, group="video" if i % 2 else "audio")
                    for i in range(n)]
        print(f"enqueued {n} jobs: #{refs[0].id}..#{refs[-1].id}; waiting for the workers")
        results = [await queue.wait(r.id, timeout=600) for r in refs]
    by_worker = Counter(f"{r['host']}/{r['pid']}" for r in results)
    for w, count in sorted(by_worker.items()):
        print(f"  {w}: {count} jobs")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 40))

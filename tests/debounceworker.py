"""A process that enqueues one debounced key many times, for the debounce race test.

    python tests/debounceworker.py URL PREFIX GO TAG N

Waits for the file GO, then enqueues ``N`` times ``bump`` with key ``burst``, args
``{"tag": TAG, "i": i}``, debounce 2 s; prints every id it got, one a line."""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta

from dagworker import wait_for_go

from aiojobqueue import JobQueue


async def main(url: str, prefix: str, go: str, tag: str, n: int) -> None:
    q = JobQueue(url, prefix=prefix)
    async with q:
        await wait_for_go(go)
        for i in range(n):
            jid = await q.enqueue("bump", {"tag": tag, "i": i}, key="burst",
                                  debounce=timedelta(seconds=2))
            print(jid, flush=True)


if __name__ == "__main__":
    url, prefix, go, tag, n = sys.argv[1:]
    asyncio.run(main(url, prefix, go, tag, int(n)))

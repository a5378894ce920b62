"""``JobQueue``'s methods on one job by its id: read it (``get``), say why it is not running
(``explain``), wait for its end, cancel it, retry it. The writes are actions.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from .batch import check_id
from .errors import JobCancelled, JobFailed
from .explain import Explanation, explain
from .models import Job, JobState
from .snapshot import read_job

if TYPE_CHECKING:
    from .core import Core


class JobMethods:
    """``JobQueue``'s methods on one job (a mixin: ``_started`` and ``poll_interval`` are
    JobQueue's)."""

    poll_interval: float

    def _started(self) -> Core:
        raise NotImplementedError

    # -- inspection -----------------------------------------------------------------------
    async def get(self, job_id: int) -> Job:
        """A snapshot of one job. Raises JobNotFoundError."""
        check_id(job_id)
        return await read_job(self._started().db, job_id)

    async def explain(self, job_id: int) -> Explanation:
        """Why the job is not running now: ``Explanation.reasons`` (see aiojobqueue.explain
        for the codes); ``str()`` of it reads as a short paragraph. Raises JobNotFoundError."""
        check_id(job_id)
        return await explain(self._started(), job_id)

    async def wait(self, job_id: int, timeout: float | None = None) -> Any:
        """Wait until the job is terminal; return its result or raise JobFailed/JobCancelled.

        Raises the builtin TimeoutError if ``timeout`` passes first, its message naming the
        job and the state it was last seen in."""
        seen: list[Job] = []
        tmo = asyncio.timeout(timeout)
        try:
            async with tmo:
                return await self._wait(job_id, seen)
        except TimeoutError as exc:
            if not tmo.expired():
                raise  # not ours (e.g. the database's)
            state = f"still {seen[-1].state}" if seen else "not read yet"
            raise TimeoutError(f"job {job_id} is {state} after waiting {timeout}s") from exc

    async def _wait(self, job_id: int, seen: list[Job]) -> Any:
        """``wait()``'s loop; ``seen`` holds the last snapshot read (for its message)."""
        delay = 0.01
        while True:
            job = await self.get(job_id)
            seen[:] = [job]
            if job.state == JobState.DONE:
                return job.result
            if job.state == JobState.FAILED:
                raise JobFailed(job_id, job.error)
            if job.state == JobState.CANCELLED:
                raise JobCancelled(job_id, job.error)
            done = self._started().signals.done
            # asyncio.timeout, not wait_for (3.11's wait_for can swallow a cancellation)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await done.wait()
            delay = min(delay * 1.5, self.poll_interval)

    async def cancel(self, job_id: int) -> None:
        """Cancel a job or container and everything waiting on it. A running job is stopped
        by its worker within about one heartbeat interval."""
        check_id(job_id)
        core = self._started()
        await core.db.write(lambda conn: core.actions.cancel(conn, job_id))

    async def retry(self, job_id: int) -> None:
        """Make a failed or cancelled job runnable again, with the jobs its end cancelled."""
        check_id(job_id)
        core = self._started()
        await core.db.write(lambda conn: core.actions.retry(conn, job_id))
        core.signals.wake()

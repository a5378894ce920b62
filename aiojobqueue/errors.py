"""The exception tree: one root, each leaf also inheriting the builtin it resembles."""

from __future__ import annotations

from typing import Any


class AioJobQueueError(Exception):
    """Root of every error aiojobqueue raises on purpose."""


class InvalidJobError(AioJobQueueError, ValueError):
    """Bad input to enqueue/batch: not JSON, unknown handler options, bad ids, cycles."""


class NotJSONError(InvalidJobError, TypeError):
    """Args, results or checkpoints that JSON cannot carry."""


class DependencyCycleError(InvalidJobError):
    """A dependency (or container membership) that would make the DAG wait on itself."""


class ContainerClosedError(InvalidJobError):
    """Children were added to a container that has already finished."""


class JobNotFoundError(AioJobQueueError, LookupError):
    """No job has this id."""


class ScheduleNotFoundError(AioJobQueueError, LookupError):
    """No periodic schedule has this name (in the schedules table)."""


class InvalidStateError(AioJobQueueError, RuntimeError):
    """The job is not in a state that allows this operation (e.g. retry of a done job)."""


class ConfigurationError(AioJobQueueError, ValueError):
    """A JobQueue setting that cannot work (e.g. lease_ttl not above heartbeat_interval)."""


class NotStartedError(ConfigurationError, RuntimeError):
    """A method that needs the database was called before ``async with queue:`` (or
    ``await queue.start()``)."""


class MissingDriverError(ConfigurationError, ImportError):
    """The database driver a URL needs is not installed; the message names the
    ``pip install "aiojobqueue[...]"`` that brings it. Also an ImportError, so code that
    caught the driver's own ModuleNotFoundError still does."""


class SchemaError(ConfigurationError):
    """The database has no aiojobqueue schema under this prefix, or another version of it."""


class UnsupportedDatabaseError(AioJobQueueError, RuntimeError):
    """The database or its version lacks what the claim needs (e.g. MySQL < 8, MariaDB < 10.6)."""


class PermanentError(AioJobQueueError):
    """Raised by a handler: this job fails for good now, whatever its ``retry_on`` and
    attempts left (a re-run cannot succeed). Subclass it for your own permanent errors."""


class JobFailed(AioJobQueueError):
    """Raised by ``wait()`` when the job failed for good.

    ``.error`` holds the recorded type, message and traceback."""

    def __init__(self, job_id: int, error: dict[str, Any] | None) -> None:
        self.job_id = job_id
        self.error = error or {}
        super().__init__(
            f"job {job_id} failed: {self.error.get('type', '?')}: {self.error.get('message', '')}"
        )


class JobCancelled(AioJobQueueError):
    """Raised by ``wait()`` when the job was cancelled (directly or by an upstream failure)."""

    def __init__(self, job_id: int, error: dict[str, Any] | None) -> None:
        self.job_id = job_id
        self.error = error or {}
        super().__init__(f"job {job_id} cancelled: {self.error.get('message', '')}")


class LeaseLostError(AioJobQueueError):
    """This attempt no longer holds its lease (it was reclaimed or cancelled)."""

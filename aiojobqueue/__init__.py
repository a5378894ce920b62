"""aiojobqueue: an asyncio-native, crash-safe DAG job scheduler on your relational database."""

from .batch import Batch, JobRef
from .errors import (
    AioJobQueueError,
    ConfigurationError,
    ContainerClosedError,
    DependencyCycleError,
    InvalidJobError,
    InvalidStateError,
    JobCancelled,
    JobFailed,
    JobNotFoundError,
    MissingDriverError,
    NotJSONError,
    NotStartedError,
    PermanentError,
    ScheduleNotFoundError,
    SchemaError,
    UnsupportedDatabaseError,
)
from .executor import JobContext, LeaseLostError
from .explain import Explanation, Reason
from .handlers import Handler
from .hooks import JobEvent
from .limits import Limit, RateLimit
from .models import Job, JobState
from .queue import JobQueue
from .schema import metadata
from .snooze import Snooze
from .sync import SyncBatch, SyncQueue
from .tags import InvalidTagError

__all__ = [
    "AioJobQueueError",
    "Batch",
    "ConfigurationError",
    "ContainerClosedError",
    "DependencyCycleError",
    "Explanation",
    "Handler",
    "InvalidJobError",
    "InvalidStateError",
    "InvalidTagError",
    "Job",
    "JobCancelled",
    "JobContext",
    "JobEvent",
    "JobFailed",
    "JobNotFoundError",
    "JobQueue",
    "JobRef",
    "JobState",
    "LeaseLostError",
    "Limit",
    "MissingDriverError",
    "NotJSONError",
    "NotStartedError",
    "PermanentError",
    "RateLimit",
    "Reason",
    "ScheduleNotFoundError",
    "SchemaError",
    "Snooze",
    "SyncBatch",
    "SyncQueue",
    "UnsupportedDatabaseError",
    "metadata",
]
__version__ = "0.1.0"

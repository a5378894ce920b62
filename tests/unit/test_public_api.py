"""``aiojobqueue.__all__`` is exactly the public API: the names SPEC.md gives users, each
importable and documented, and nothing else public at the package's top level (its
submodules aside), so a helper added there by accident shows up here."""

from __future__ import annotations

import inspect
import types

import aiojobqueue

PUBLIC = {
    # the queue, its handlers, and what a handler is given
    "JobQueue", "Handler", "JobContext", "Batch", "JobRef",
    # the same for synchronous code
    "SyncQueue", "SyncBatch",
    # what it returns
    "Job", "JobState", "JobEvent", "Explanation", "Reason",
    # limits
    "Limit", "RateLimit",
    # workflows: raised by a handler to run again later without using an attempt
    "Snooze",
    # errors
    "AioJobQueueError", "ConfigurationError", "ContainerClosedError", "DependencyCycleError",
    "InvalidJobError", "InvalidStateError", "JobCancelled", "JobFailed", "JobNotFoundError",
    "LeaseLostError", "NotJSONError", "NotStartedError", "PermanentError", "SchemaError",
    "UnsupportedDatabaseError", "InvalidTagError", "ScheduleNotFoundError", "MissingDriverError",
    # the tables, for Alembic users
    "metadata",
}


def test_all_is_exactly_the_public_api() -> None:
    assert set(aiojobqueue.__all__) == PUBLIC
    assert len(aiojobqueue.__all__) == len(PUBLIC)  # no name twice


def test_every_public_name_is_importable_and_documented() -> None:
    for name in aiojobqueue.__all__:
        obj = getattr(aiojobqueue, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert (obj.__doc__ or "").strip(), f"{name} has no docstring"


def test_nothing_else_public_at_the_top_level() -> None:
    extra = {n for n, v in vars(aiojobqueue).items()
             if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert extra - PUBLIC == set()

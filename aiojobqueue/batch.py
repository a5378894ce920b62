"""DAG building: ``Batch`` collects jobs and containers, checks every option as it is added,
and hands them to the insert (insert.py) as one DAG."""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from . import schema as S
from .dialects.columns import NAME_LEN
from .errors import InvalidJobError, JobNotFoundError, NotJSONError
from .handlers import Handler
from .tags import check_tags

if TYPE_CHECKING:
    from .handlers import HandlerSpec
    from .settings import Settings

#: inserts a batch's specs (on the given connection, or in a transaction of its own)
Insert = Callable[[list["_Spec"], "AsyncConnection | AsyncSession | None"], Awaitable[list[int]]]

MAX_ID = 2**63 - 1  # BIGINT / SQLite INTEGER
# weight, priority, max_attempts are INTEGER columns: 32 bits on PostgreSQL and MySQL, so a
# larger value is refused here on every database rather than by one driver (untyped).
MAX_INT = 2**31 - 1


def check_id(job_id: Any) -> None:
    """Ids are positive 64-bit ints: anything else names no job (and must not reach the
    driver, which would fail with an untyped error)."""
    if not isinstance(job_id, int) or isinstance(job_id, bool) or not 0 < job_id <= MAX_ID:
        raise JobNotFoundError(f"no job with id {job_id!r}")


class UnknownJobError(InvalidJobError, JobNotFoundError):
    """``depends_on`` or ``parent`` names a job id that does not exist."""


# One encoder for every check (json.dumps with an option builds a new encoder per call);
# its output is what json.dumps gives, and what the JSON column type would have stored.
_ENCODE = json.JSONEncoder(allow_nan=False).encode


def check_json(value: Any, what: str) -> str:
    """Serialize strictly (no NaN, only JSON types) or raise NotJSONError."""
    try:
        return _ENCODE(value)
    except (TypeError, ValueError) as exc:
        raise NotJSONError(f"{what} is not JSON-serializable: {exc}") from None


@dataclass(eq=False, slots=True)
class JobRef:
    """A job added to a batch; ``.id`` is known once the batch has been inserted."""

    _batch: Batch
    _index: int
    type: str
    is_container: bool
    _id: int | None = None

    @property
    def id(self) -> int:
        if self._id is None:
            raise InvalidJobError("this job has no id yet: the batch has not been inserted")
        return self._id

    def __repr__(self) -> str:
        return f"JobRef({self.type!r}, id={self._id})"


Ref = JobRef | int
#: A job in the batch's graph: ("n", index) for a fresh one, ("e", id) for an existing one.
Node = tuple[str, int]


@dataclass(slots=True)
class _Spec:
    ref: JobRef
    type: str
    args: str  # the JSON text, encoded once when added (validated and bound as is)
    group: str
    weight: int
    priority: int
    timeout: float | None
    max_attempts: int
    key: str | None
    run_after: timedelta | datetime | None
    depends_on: list[Ref]
    parent: Ref | None
    is_container: bool
    # no group / weight given: the parent container's (set by dag.plan_graph)
    group_from_parent: bool = False
    weight_from_parent: bool = False
    # filled during insert: graph nodes (see insert_specs), state, pending counter
    node: Node = ("n", 0)
    dep_nodes: list[Node] = field(default_factory=list)
    parent_node: Node | None = None
    state: str = ""
    pending: int = 0
    cancelled_by: int | None = None
    #: the enqueuer's W3C trace context as JSON text (aiojobqueue.tracing), else None
    trace: str | None = None
    #: an external step (Batch.external): no worker runs it (external.py)
    is_external: bool = False
    #: the run condition (conditions.py): "done", "failed" or "finished"
    when: str = "done"
    #: the job's tags (aiojobqueue.tags), checked
    tags: tuple[str, ...] = ()


class Batch:
    """Collects jobs and containers, then inserts them as one DAG in one transaction.

    Use ``async with queue.batch() as b:``; the insert happens when the block exits
    without an exception. With ``connection=`` the insert joins the caller's transaction and
    the jobs exist if and only if the caller commits.
    """

    def __init__(self, settings: Settings, handlers: Mapping[str, HandlerSpec], insert: Insert,
                 connection: AsyncConnection | AsyncSession | None = None) -> None:
        self._settings = settings
        self._handlers = handlers
        self._insert = insert
        self._conn = connection
        self._specs: list[_Spec] = []
        self._done = False

    # -- building ---------------------------------------------------------------------------
    def add(
        self,
        type: str | Handler[..., Any],
        args: dict[str, Any] | None = None,
        *,
        group: str | None = None,
        weight: int | None = None,
        depends_on: Iterable[Ref] = (),
        run_after: timedelta | datetime | float | None = None,
        priority: int = 0,
        timeout: float | None = None,
        max_attempts: int | None = None,
        key: str | None = None,
        parent: Ref | None = None,
        when: str = "done",
        tags: Iterable[str] | None = None,
    ) -> JobRef:
        """Add a job; returns a ref usable in ``depends_on``/``parent`` of later adds (its
        ``.id`` once the batch has been inserted).

        ``type`` is a job type or a ``Handler``. Where the handler is known (a Handler, or a
        type this queue has a handler for) ``args`` must fit its signature, else
        InvalidJobError naming the argument. Without ``group`` or ``weight`` a child of a
        container takes its container's, any other job the queue's ``default_group`` and 1.
        See ``JobQueue.enqueue`` for the other options. ``when``: run once every dependency
        is done (``"done"``, the default), once every one is terminal and one failed or was
        cancelled (``"failed"``), or once every one is terminal (``"finished"``); see
        docs/workflows.md. ``tags``: labels to find the job by (aiojobqueue.tags;
        InvalidTagError on a bad one)."""
        if when.__class__ is not str or when not in S.WHEN_KINDS:
            raise InvalidJobError(f"when must be 'done', 'failed' or 'finished': {when!r}")
        labels = check_tags(tags) if tags is not None else ()  # before anything is added
        ref = self._add(
            type, {} if args is None else args, False, group, weight, depends_on, run_after,
            priority, timeout, max_attempts, key, parent,
        )
        if when != "done":
            self._specs[-1].when = when
        if labels:
            self._specs[-1].tags = labels
        return ref

    def container(
        self,
        type: str,
        *,
        group: str | None = None,
        weight: int | None = None,
        depends_on: Iterable[Ref] = (),
        priority: int = 0,
        key: str | None = None,
        parent: Ref | None = None,
    ) -> JobRef:
        """Add a container: it never runs; it is done when all its children are done. Its
        children take its ``group`` and ``weight`` unless given their own."""
        return self._add(
            type, {}, True, group, weight, depends_on, None, priority, None, 1, key, parent
        )

    def external(
        self,
        type: str = "external",
        args: dict[str, Any] | None = None,
        *,
        group: str | None = None,
        timeout: timedelta | float | None = None,
        key: str | None = None,
        depends_on: Iterable[Ref] = (),
        priority: int = 0,
        parent: Ref | None = None,
    ) -> JobRef:
        """Add an external step: a node no worker runs. Once its dependencies are done it
        is ``external`` until ``queue.complete(id, result)`` or ``queue.fail(id, error)``
        ends it, or it fails ``timeout`` (seconds or a timedelta; None: never) after it
        became external. Dependents and containers treat it like any job."""
        if isinstance(timeout, timedelta):
            timeout = timeout.total_seconds()
        ref = self._add(type, {} if args is None else args, False, group, None, depends_on,
                        None, priority, timeout, 1, key, parent)
        self._specs[-1].is_external = True
        return ref

    def _add(
        self,
        type: str | Handler[..., Any],
        args: Any,
        is_container: bool,
        group: str | None,
        weight: int | None,
        depends_on: Iterable[Ref],
        run_after: timedelta | datetime | float | None,
        priority: int,
        timeout: float | None,
        max_attempts: int | None,
        key: str | None,
        parent: Ref | None,
    ) -> JobRef:
        if self._done:
            raise InvalidJobError("this batch has already been inserted")
        name, handler, args_json = self._checked_job(type, args, is_container)
        # These options at their defaults (a bulk load, with or without a group) cannot be
        # wrong: skip their checks. What comes from the queue's and the handler's settings
        # (group, timeout, max_attempts) is checked either way, in the same order.
        plain = (weight is None and priority.__class__ is int and priority == 0
                 and key is None and run_after is None and parent is None
                 and depends_on.__class__ is tuple and not depends_on)
        inherit_group = group is None and parent is not None
        inherit_weight = weight is None and parent is not None
        group, weight, timeout, max_attempts = self._checked_settings(
            group, weight, priority, timeout, max_attempts, handler, plain)
        when: timedelta | datetime | None = None
        deps: list[Ref] = []
        if not plain:
            when, deps = self._checked_placement(key, run_after, depends_on, parent)
        ref = JobRef(self, len(self._specs), name, is_container)
        self._specs.append(
            _Spec(
                ref, name, args_json, group, int(weight), int(priority),
                None if timeout is None else float(timeout), int(max_attempts), key,
                when, deps, parent, is_container, inherit_group, inherit_weight,
            )
        )
        return ref

    def _checked_job(
        self, type: str | Handler[..., Any], args: Any, is_container: bool
    ) -> tuple[str, HandlerSpec | None, str]:
        """The job's type, its handler where known, and its args as JSON text; checked
        (args against the handler's signature too)."""
        if isinstance(type, Handler):
            handler: HandlerSpec | None = type.spec
            type = type.type
        elif not isinstance(type, str) or not type or len(type) > NAME_LEN:
            raise InvalidJobError(
                f"job type must be a non-empty string of <= {NAME_LEN} chars: {type!r}")
        else:
            handler = self._handlers.get(type)
        if not isinstance(args, dict):
            raise InvalidJobError(f"args must be a dict, got {args.__class__.__name__}")
        if handler is not None and handler.params is not None and not is_container:
            why = handler.params.mismatch(args)
            if why is not None:
                raise InvalidJobError(f"args of {type!r} do not fit its handler: {why}")
        try:  # (not check_json: its message would be formatted on every call)
            args_json = _ENCODE(args)
        except (TypeError, ValueError) as exc:
            raise NotJSONError(f"args of {type!r} is not JSON-serializable: {exc}") from None
        return type, handler, args_json

    def _checked_settings(
        self, group: str | None, weight: int | None, priority: int, timeout: float | None,
        max_attempts: int | None, handler: HandlerSpec | None, plain: bool,
    ) -> tuple[str, int, float | None, int]:
        """Group, weight, timeout and max_attempts with their defaults (the queue's, the
        handler's) filled in, checked in this order with the priority (not when ``plain``)."""
        group = self._settings.default_group if group is None else group
        if not isinstance(group, str) or not group or len(group) > NAME_LEN:
            raise InvalidJobError(
                f"group must be a non-empty string of <= {NAME_LEN} chars: {group!r}")
        if weight is None:
            weight = 1
        elif not _is_int(weight) or not 1 <= weight <= MAX_INT:
            raise InvalidJobError(f"weight must be a (32-bit) int >= 1: {weight!r}")
        if not plain and (not _is_int(priority) or not -MAX_INT <= priority <= MAX_INT):
            raise InvalidJobError(f"priority must be a (32-bit) int: {priority!r}")
        if timeout is None and handler is not None:
            timeout = handler.timeout
        if timeout is not None and (
            not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0
        ):
            raise InvalidJobError(f"timeout must be a positive number of seconds: {timeout!r}")
        if max_attempts is None:
            max_attempts = (handler.max_attempts if handler is not None else None) or (
                self._settings.max_attempts
            )
        if not _is_int(max_attempts) or not 1 <= max_attempts <= MAX_INT:
            raise InvalidJobError(f"max_attempts must be a (32-bit) int >= 1: {max_attempts!r}")
        return group, weight, timeout, max_attempts

    def _checked_placement(
        self, key: str | None, run_after: timedelta | datetime | float | None,
        depends_on: Iterable[Ref], parent: Ref | None,
    ) -> tuple[timedelta | datetime | None, list[Ref]]:
        """The key, run_after, dependencies and parent (where and when the job goes) checked;
        returns run_after as a timedelta or datetime and the dependencies as a list."""
        if key is not None and (not isinstance(key, str) or not key or len(key) > 255):
            raise InvalidJobError(f"key must be a non-empty string of <= 255 chars: {key!r}")
        if isinstance(run_after, (int, float)) and not isinstance(run_after, bool):
            run_after = timedelta(seconds=run_after)
        if run_after is not None and not isinstance(run_after, (timedelta, datetime)):
            raise InvalidJobError(
                f"run_after must be a timedelta, datetime or seconds: {run_after!r}"
            )
        deps = list(depends_on)
        for d in deps:
            self._check_ref(d)
        if parent is not None:
            self._check_ref(parent)
            if isinstance(parent, JobRef) and not parent.is_container:
                raise InvalidJobError(f"parent {parent!r} is not a container")
        return run_after, deps

    def _check_ref(self, r: Any) -> None:
        if isinstance(r, JobRef):
            if r._batch is not self:
                if r._id is None:
                    raise InvalidJobError(f"{r!r} belongs to another batch that was not inserted")
                return
            return
        if not _is_int(r) or r < 1:
            raise InvalidJobError(f"not a job id or batch ref: {r!r}")
        if r > MAX_ID:  # the database would reject it with a driver error
            raise UnknownJobError(f"unknown job id in depends_on/parent: {r}")

    # -- context manager --------------------------------------------------------------------
    async def __aenter__(self) -> Batch:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if et is None:
            await self.commit()

    async def commit(self) -> list[int]:
        """Insert everything added so far (called by ``async with`` on exit)."""
        if self._done:
            raise InvalidJobError("this batch has already been inserted")
        self._done = True
        if not self._specs:
            return []
        return await self._insert(self._specs, self._conn)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)

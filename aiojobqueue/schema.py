"""Tables, the table prefix, and the schema version: the ``jobs`` table and its indexes here,
the tables beside it in side_tables.py.

Job states (see the README for the diagram):

* leaves: ``waiting`` (blocked on dependencies or on its container's dependencies) ->
  ``scheduled`` (runnable once ``run_after`` passes; also retries in backoff) -> ``ready`` ->
  ``running`` (leased) -> ``done`` | ``failed`` | ``cancelled``;
* containers: ``waiting`` -> ``active`` (children may run) -> ``done`` | ``failed`` | ``cancelled``.

``pending`` counts what still blocks a job: its unfinished dependencies, plus ``CREDIT`` while
its container is not yet active, except for a job that waits on a sibling holding that
credit (it cannot run before the container is active anyway; activation then rewrites only
the credited children). It is maintained when an upstream finishes (for most of a wide
fan-out, right after: see the ``releases`` table, v5), so the claim only ever looks at
``ready`` rows and never walks waiting or finished ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    false,
    text,
)

from .dialects.columns import (
    NAME_LEN,
    UTCDateTime,
    builds_partial,
    drop_routines_with,
    partial_where,
)
from .dialects.columns import Id as _Id
from .dialects.columns import Json as _Json
from .side_tables import schedule_table, side_tables, worker_tables

SCHEMA_VERSION = 10
#: What a container not yet active adds to its children's ``pending`` (v3; was 1): larger
#: than any count of dependencies, so activation tells the credited children apart.
CREDIT = 1 << 30
DEFAULT_PREFIX = "ajq_"

WAITING, SCHEDULED, READY, RUNNING, ACTIVE = "waiting", "scheduled", "ready", "running", "active"
#: v9: leased ahead into a slot this worker holds under a counted cap, not started and
#: not counted by any cap (see slots.Slots.take_over, docs/scheduling.md "Held slots")
LEASED = "leased"
#: what a worker holds a lease on: renewed by its heartbeat, reclaimed once expired
LEASED_STATES = (RUNNING, LEASED)
DONE, FAILED, CANCELLED = "done", "failed", "cancelled"
TERMINAL = (DONE, FAILED, CANCELLED)
#: v10: an external step released from its dependencies, waiting for ``complete()`` or
#: ``fail()`` (or its timeout); no claim ever picks it (see external.py)
EXTERNAL = "external"
LIVE = (WAITING, SCHEDULED, READY, RUNNING, ACTIVE, LEASED, EXTERNAL)

#: v10: EXTERNAL_KIND is the kind of an external step (``b.external``), a job no worker runs
JOB, CONTAINER, EXTERNAL_KIND = "job", "container", "external"
#: v10: the kinds of jobs with a run condition (conditions.py): ``when="failed"`` (ONFAIL)
#: and ``when="finished"`` (ALWAYS); ``when="done"`` is a plain JOB
ONFAIL, ALWAYS = "onfail", "always"
WHEN_KINDS = {"done": JOB, "failed": ONFAIL, "finished": ALWAYS}
#: What a ``when="failed"`` job adds to its ``pending`` until an upstream fails or is
#: cancelled (conditions.py): below CREDIT, above any count of dependencies.
HOLD = 1 << 20



@dataclass(frozen=True)
class Tables:
    """The tables of one prefix."""

    metadata: MetaData
    jobs: Table
    deps: Table
    meta: Table
    groups: Table
    workers: Table
    rate: Table
    releases: Table
    policy: Table
    schedules: Table
    #: v10: (job_id, tag) pairs (aiojobqueue.tags)
    tags: Table
    #: v10: the retention in force and its sweep's lease and last run (aiojobqueue.retention)
    sweeps: Table


def _partial(state: str) -> dict[str, Any]:
    return _where(f"state = '{state}'")


def _where(cond: str) -> dict[str, Any]:
    """A partial index where the dialect has them (MySQL/MariaDB index every row)."""
    return partial_where(text(cond))


def v2_indexes(p: str) -> list[Index]:
    """Indexes that v2 made partial: most jobs have no parent and are never cancelled by an
    upstream, and a live job has no finish time, so these skip the hot rows (every claim and
    finalize changes ``state``, which rewrites an entry in every index the row is in)."""
    return [
        # roll-up probes a container's live children
        Index(f"{p}ix_parent", "parent_id", "state", **_where("parent_id IS NOT NULL")),
        Index(f"{p}ix_cancelled_by", "cancelled_by", **_where("cancelled_by IS NOT NULL")),
        Index(f"{p}ix_finished", "state", "finished_at", **_where("finished_at IS NOT NULL")),
    ]


def leased_index(p: str) -> Index:
    """v9: the ``leased`` rows (few: at most the slots each worker holds), for the
    heartbeat's renewal and the reclaim of a dead worker's."""
    return Index(f"{p}ix_leased", "state", "lease_owner", "lease_expires", **_partial(LEASED))


def external_index(p: str) -> Index:
    """v10: the ``external`` rows (few), for the timeout sweep (external.py): an external
    step's deadline is its ``lease_expires`` (no worker leases it; set when it becomes
    external: ``started_at`` + its ``timeout``). Not on MySQL: see ``running_indexes``."""
    return Index(f"{p}ix_external", "state", "lease_expires",
                 **_partial(EXTERNAL)).ddl_if(callable_=builds_partial)


def running_indexes(p: str) -> list[Index]:
    """The running rows by group (the census, the reclaim) and by owner (renewal, shutdown).
    PostgreSQL and SQLite only, as ``ix_external``: MySQL/MariaDB index every row, so there
    each index holding ``state`` is rewritten by every state change, and these serve
    nothing ``ix_ready`` (state, group_key) and ``ix_leased`` (state, lease_owner,
    lease_expires) do not (v10: fewer redo bytes a job, docs/operations.md)."""
    return [Index(f"{p}ix_running", "state", "group_key", "lease_expires",
                  **_partial(RUNNING)).ddl_if(callable_=builds_partial),
            Index(f"{p}ix_running_owner", "state", "lease_owner",
                  **_partial(RUNNING)).ddl_if(callable_=builds_partial)]


def live_key_index(p: str) -> Index:
    """v4: ``live_key`` unique among non-NULL values. Partial where the dialect has them, so
    a keyless job (most) has no entry: none from its insert nor from each later state change
    (never HOT on PostgreSQL: ``state`` is indexed). MySQL/MariaDB index every row; InnoDB's
    unique index allows any number of NULLs, so the rule is the same there."""
    return Index(f"{p}ux_live_key", "live_key", unique=True, **_where("live_key IS NOT NULL"))


def ready_weight_index(p: str) -> Index:
    """The census's "largest weight among a group's ready jobs". v4: only jobs heavier than
    the default weight 1 have an entry (a group with ready jobs but none here weighs 1), so
    the common job adds no entry when it becomes ready, nor when it is enqueued ready (v1-v3:
    every ready job). MySQL/MariaDB index every row, as before."""
    return Index(f"{p}ix_ready_weight", "state", "group_key", "weight",
                 **_where(f"state = '{READY}' AND weight > 1"))


#: The states the dashboard overview counts per group through ``overview_indexes`` (ready
#: and running go through the claim's indexes, which lead with the same two columns).
OVERVIEW_COUNTED = (WAITING, SCHEDULED, FAILED)
#: A term each query of ``overview_indexes`` repeats (SQLite matches a partial index by
#: its terms). For waiting rows, always true (a waiting row waits on something), and
#: absent from the release's ``id IN (...) AND state = 'waiting'``: a planner that has not
#: yet analysed a freshly loaded table would otherwise read that index whole for it,
#: instead of taking the ids by primary key.
OVERVIEW_EXTRA = {WAITING: " AND pending > 0"}


def overview_indexes(p: str) -> list[Index]:
    """v7: the dashboard overview's per-group counts of waiting, scheduled and failed jobs
    (web/data.py), and the metrics' count of waiting ones (metrics.gauge_queries), as
    bounded index probes instead of a read of every such row. Partial, so
    they cost an entry only to the rows in that state: a waiting job's insert (a DAG's
    dependents), a scheduled one's, a failure; leaving the state adds none on PostgreSQL.
    PostgreSQL and SQLite only: on MySQL/MariaDB, which index every row, ``ix_ready``
    already leads with (state, group_key) for every state, and three more indexes there
    would each be rewritten by every state change."""
    return [Index(f"{p}ix_{state}_group", "state", "group_key",
                  **_where(f"state = '{state}'{OVERVIEW_EXTRA.get(state, '')}"))
            .ddl_if(callable_=builds_partial)
            for state in OVERVIEW_COUNTED]


#: The indexes (less their prefix) built only where the dialect has partial indexes.
PARTIAL_ONLY = (*(f"ix_{state}_group" for state in OVERVIEW_COUNTED),
                "ix_running", "ix_running_owner", "ix_external")


def include_object(obj: Any, name: str | None, type_: str, reflected: bool,
                   compare_to: Any) -> bool:
    """An Alembic ``include_object`` hook that leaves the ``PARTIAL_ONLY`` indexes out of
    the comparison, on both sides: they exist on PostgreSQL and SQLite only, so on MySQL/MariaDB
    autogenerate would otherwise propose to create them. aiojobqueue builds them itself
    (``aiojobqueue migrate``). Everything else is compared as usual."""
    if type_ != "index" or name is None:
        return True
    table = getattr(getattr(obj, "table", None), "name", "") or ""
    if not table.endswith("jobs"):
        return True
    prefix = table[: -len("jobs")]
    return name not in {prefix + n for n in PARTIAL_ONLY}


def build_tables(prefix: str = DEFAULT_PREFIX, metadata: MetaData | None = None) -> Tables:
    """Build the schema under ``prefix`` (into ``metadata`` if given, e.g. an Alembic one)."""
    md = metadata if metadata is not None else MetaData()
    jobs = jobs_table(prefix, md)
    deps, meta, groups, workers, rate = worker_tables(prefix, md)
    releases, policy, tags, sweeps = side_tables(prefix, md)
    schedules = schedule_table(prefix, md)
    return Tables(md, jobs, deps, meta, groups, workers, rate, releases, policy, schedules,
                  tags, sweeps)


def _job_columns() -> list[Column[Any]]:
    """The jobs table's columns: one row per job, container or external step."""
    return [
        Column("id", _Id, primary_key=True, autoincrement=True),
        Column("type", String(NAME_LEN), nullable=False),
        Column("kind", String(10), nullable=False, server_default=JOB),
        Column("state", String(10), nullable=False),
        Column("args", _Json, nullable=False),
        Column("result", _Json),
        Column("error", _Json),
        Column("checkpoint", _Json),
        # v6: what a running handler reported (see aiojobqueue.progress) and the history of
        # failed attempts (aiojobqueue.history); NULL for most jobs, so no cost to them.
        Column("progress", _Json),
        Column("errors", _Json),
        # v7: the W3C trace context of the enqueuer's span (aiojobqueue.tracing), and the
        # first attempt's once one failed; NULL unless OpenTelemetry traced the enqueue.
        Column("trace", _Json),
        Column("parent_id", _Id),
        Column("group_key", String(NAME_LEN), nullable=False),
        Column("weight", Integer, nullable=False, server_default="1"),
        Column("priority", Integer, nullable=False, server_default="0"),
        Column("pending", Integer, nullable=False, server_default="0"),
        Column("run_after", UTCDateTime, nullable=False),
        Column("attempts", Integer, nullable=False, server_default="0"),
        Column("max_attempts", Integer, nullable=False),
        Column("attempt_limit", Integer, nullable=False),
        # v10: attempts given back without an outcome (graceful shutdown, an unrenewable
        # lease, a held job returned unstarted): not counted (see aiojobqueue.attempts)
        Column("releases", Integer, nullable=False, server_default="0"),
        Column("timeout", Float),
        Column("lease_owner", String(64)),
        Column("lease_expires", UTCDateTime),
        Column("cancel_requested", Boolean, nullable=False, server_default=false()),
        Column("cancelled_by", _Id),
        Column("key", String(255)),
        # Equal to key while the job is live, NULL once terminal: unique among non-NULL values
        # (live_key_index) gives "unique among live jobs" on every dialect.
        Column("live_key", String(255)),
        Column("created_at", UTCDateTime, nullable=False),
        Column("started_at", UTCDateTime),
        Column("finished_at", UTCDateTime),
        # Set (never cleared) when a dependency edge to this job is added, under its row lock:
        # a finalize that sees it unset needs no dependents look-up (see finalize.plain_stmt).
        Column("has_dependents", Boolean, nullable=False, server_default=false()),
        # v10: how many times a handler raised Snooze (each put the job back without using
        # an attempt: see snooze.py)
        Column("snoozes", Integer, nullable=False, server_default="0"),
    ]


def jobs_table(p: str, md: MetaData) -> Table:
    """The jobs table and its indexes (on PostgreSQL its routines are dropped with it)."""
    jobs = Table(
        f"{p}jobs",
        md,
        *_job_columns(),
        # `state` leads every state index so MySQL/MariaDB (no partial indexes) can use them too.
        ready_weight_index(p),
        *running_indexes(p),
        leased_index(p),
        Index(f"{p}ix_scheduled", "state", "run_after", **_partial(SCHEDULED)),
        external_index(p),
        *v2_indexes(p),
        *overview_indexes(p),
        live_key_index(p),
    )
    # The claim's index. priority.desc() and not text("priority DESC"): the same DDL, but an
    # index Alembic can compare to the database's (a text element reads as a change on every
    # autogenerate).
    Index(f"{p}ix_ready", jobs.c.state, jobs.c.group_key, jobs.c.priority.desc(), jobs.c.id,
          **_partial(READY))
    drop_routines_with(jobs)
    return jobs


_default = build_tables()
#: The default-prefix schema, for Alembic's ``target_metadata``.
metadata = _default.metadata

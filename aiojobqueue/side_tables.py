"""The tables beside ``jobs`` (schema.build_tables puts them all under one prefix): the
dependency edges, the meta rows, the groups, the workers and the rate ledger
(``worker_tables``); the split releases, the stored policy, the tags and the sweeps
(``side_tables``); the periodic schedules (``schedule_table``)."""

from __future__ import annotations

from sqlalchemy import Boolean, Column, Float, Index, Integer, MetaData, String, Table, false

from .dialects.columns import NAME_LEN, UTCDateTime
from .dialects.columns import Id as _Id
from .dialects.columns import Json as _Json


def worker_tables(p: str, md: MetaData) -> tuple[Table, Table, Table, Table, Table]:
    """The dependency edges, the meta rows, the groups, the workers and the rate ledger."""
    deps = Table(
        f"{p}deps",
        md,
        Column("job_id", _Id, primary_key=True),
        Column("depends_on_id", _Id, primary_key=True),
        Index(f"{p}ix_deps_up", "depends_on_id"),
    )
    meta = Table(
        f"{p}meta",
        md,
        Column("name", String(64), primary_key=True),
        Column("value", String(255), nullable=False),
    )
    groups = Table(
        f"{p}groups",
        md,
        Column("group_key", String(NAME_LEN), primary_key=True),
    )
    workers = Table(
        f"{p}workers",
        md,
        Column("id", String(64), primary_key=True),
        Column("host", String(255), nullable=False),
        Column("pid", Integer, nullable=False),
        Column("started_at", UTCDateTime, nullable=False),
        Column("last_seen", UTCDateTime, nullable=False),
        Column("running", Integer, nullable=False, server_default="0"),
        # v6: the job types the worker serves, its capacity and the caps it enforces
        # (concurrency, group limits, rate limits), for explain() and status
        Column("types", _Json),
        Column("capacity", Integer),
        Column("config", _Json),
    )
    rate = Table(
        f"{p}rate",
        md,
        Column("id", _Id, primary_key=True, autoincrement=True),
        Column("name", String(100), nullable=False),
        Column("at", UTCDateTime, nullable=False),
        # v8: the starts one claim recorded (one row per claim, not per start); a server
        # default, so a row written without it (v7) counts one, as it did then
        Column("starts", Integer, nullable=False, server_default="1"),
        # v8: with `starts`, the budget's SUM over a window is a range of this index alone
        # (v7: name, at; InnoDB then read each row's clustered record for it)
        Index(f"{p}ix_rate", "name", "at", "starts"),
    )
    return deps, meta, groups, workers, rate


def side_tables(p: str, md: MetaData) -> tuple[Table, Table, Table, Table]:
    """The split releases (v5), the policy, the tags and the sweeps (v10)."""
    # v5: the dependents of a finished job whose release was split off its finalize (the
    # PostgreSQL routine releases the first of a large fan-out in the finalizing call and the
    # rest in a call of its own right after; see fanout.py). A row lives
    # for milliseconds; one left by a worker that died is finished by any other.
    releases = Table(
        f"{p}releases",
        md,
        Column("id", _Id, primary_key=True, autoincrement=True),
        Column("job_id", _Id, nullable=False),  # the finished job
        Column("ids", _Json, nullable=False),  # a part of its dependents still to release
        Column("created_at", UTCDateTime, nullable=False),
    )
    # v10: the policy (caps, weights, rates, pauses) as rows; see stored_policy.py
    policy = Table(
        f"{p}policy",
        md,
        Column("scope", String(10), primary_key=True),  # queue | group | type
        Column("name", String(NAME_LEN), primary_key=True),  # "" for the queue; "*": default
        Column("weight", Integer),
        Column("cap", Integer),
        Column("rate_n", Integer),
        Column("rate_per", Float),
        Column("paused", Boolean, nullable=False, server_default=false()),
    )

    # v10: a job's tags; (tag, job_id) serves a tag filter as one index range, newest first
    tags = Table(
        f"{p}tags",
        md,
        Column("job_id", _Id, primary_key=True),
        Column("tag", String(100), primary_key=True),
        Index(f"{p}ix_tags_tag", "tag", "job_id"),
    )
    # v10: one row per sweep kind ("retention"): its lease (one sweeper at a time, replaced
    # once the lease expires), the retention in force and what the last sweep did
    sweeps = Table(
        f"{p}sweeps",
        md,
        Column("name", String(32), primary_key=True),
        Column("lease_owner", String(64)),
        Column("lease_expires", UTCDateTime),
        Column("policy", _Json),
        Column("last_started", UTCDateTime),
        Column("last_finished", UTCDateTime),
        Column("last_deleted", Integer, nullable=False, server_default="0"),
        Column("total_deleted", _Id, nullable=False, server_default="0"),
    )
    return releases, policy, tags, sweeps


def schedule_table(p: str, md: MetaData) -> Table:
    """v10: one row per periodic schedule (aiojobqueue.schedules): its spec as last declared
    by a worker's code, whether an operator paused it, and the last slot enqueued (a fixed-
    width UTC ISO string, compared as text; it was the ``cron:<name>`` meta row before)."""
    return Table(
        f"{p}schedules",
        md,
        Column("name", String(50), primary_key=True),
        Column("type", String(NAME_LEN), nullable=False, server_default=""),  # "": never declared
        Column("cron", String(120)),
        Column("every", Float),
        Column("tz", String(64)),
        Column("args", _Json),
        Column("options", _Json),
        Column("paused", Boolean, nullable=False, server_default=false()),
        Column("last_slot", String(32), nullable=False, server_default=""),
        Column("declared_at", UTCDateTime),
    )

"""The dashboard's vocabulary: its bounds, the states it counts, and the data each page
shows (plain dataclasses the templates and the JSON API both read). The reads that fill
them are in ``data.py`` (with ``overview.py`` and ``dagreads.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import literal_column

from .. import schema as S
from ..errors import InvalidJobError
from ..models import Job, JobState
from ..tags import check_tag

#: Counts stop here: "10,000+" is as useful to an operator as the exact figure and costs a
#: bounded index range instead of a scan of millions of rows.
CAP = 10_000
#: ... and a group's count, where a state has more than CAP rows in all.
GROUP_CAP = 500
#: The change marker's counts (it only needs to notice a change).
MARK_CAP = 1_000
#: Ids one page of a filtered job list looks at, at most (a sparse filter pages on).
WINDOW = 50_000
#: Rows per page of the job list.
PAGE = 50
#: Groups the overview lists (the busiest first).
MAX_GROUPS = 100
#: Ready jobs per group looked at for the oldest one's age (beyond: a lower bound).
AGE_PROBE = 100
#: Finished jobs per state the throughput chart counts (beyond: the oldest minutes are short).
RATE_PROBE = 50_000
#: DAG nodes fetched at most; the page draws ``DAG_DRAW`` and summarises the rest.
DAG_FETCH = 2_000
DAG_DRAW = 500
#: Children of one container drawn at most; the rest become one summary box.
DAG_CHILDREN = 60
#: Workers seen within this many seconds count as live.
LIVE_WORKER = 60.0

STATES = tuple(s.value for s in JobState)
LEAF_COUNTED = (S.READY, S.RUNNING, S.LEASED, S.SCHEDULED, S.WAITING, S.FAILED)
RETRYABLE = (S.FAILED, S.CANCELLED)
CANCELLABLE = S.LIVE
MAX_TEXT = 200


def lit(state: str) -> Any:
    """A known state as a SQL literal (a bind parameter would not match a partial index)."""
    if state not in STATES:  # pragma: no cover - callers pass constants or checked input
        raise InvalidJobError(f"unknown state {state!r}")
    return literal_column(f"'{state}'")


@dataclass(frozen=True)
class Count:
    """A count that stops at ``CAP``."""

    n: int
    capped: bool = False

    def __str__(self) -> str:
        return f"{self.n:,}+" if self.capped else f"{self.n:,}"

    def json(self) -> dict[str, Any]:
        return {"n": self.n, "capped": self.capped}


def count_of(n: int, cap: int | None = None) -> Count:
    """``n`` as a Count that stops at ``cap`` (default ``CAP``)."""
    cap = CAP if cap is None else cap
    return Count(min(n, cap), n > cap)


# -- page data ------------------------------------------------------------------------------
@dataclass
class GroupRow:
    """One group on the overview."""

    group: str
    weight: int
    running: int
    target: int | None
    cap: int | None
    counts: dict[str, Count]
    #: Seconds the oldest ready job has waited; ``age_min`` marks a lower bound.
    oldest_ready: float | None
    age_min: bool = False
    #: its stored policy (web/policyreads.row_policy): own and applied weight, cap, rate,
    #: pause
    rule: dict[str, Any] = field(default_factory=dict)


@dataclass
class Gauge:
    """A cap and how much of it is used now."""

    name: str
    used: int
    limit: int | None
    detail: str = ""


@dataclass
class Overview:
    """The overview page."""

    now: datetime
    groups: list[GroupRow]
    groups_total: int
    totals: dict[str, Count]
    gauges: list[Gauge]
    #: Per minute over the last hour, oldest first: (minute start, done, failed).
    throughput: list[tuple[datetime, int, int]]
    #: The chart's oldest minutes are short because more than RATE_PROBE jobs finished.
    throughput_capped: bool
    workers_live: int
    #: the stored policy as JSON (policy_text.policy_data); targets only under a global cap
    policy: dict[str, Any] = field(default_factory=dict)
    targets: bool = False


@dataclass(frozen=True)
class Filters:
    """The filters of the job list and the bulk actions (all optional)."""

    state: str | None = None
    group: str | None = None
    type: str | None = None
    parent: int | None = None
    q: str | None = None
    #: jobs carrying this tag (aiojobqueue.tags)
    tag: str | None = None

    @classmethod
    def parse(cls, params: Any) -> Filters:
        """From query or form parameters; raises InvalidJobError on a bad value."""

        def text(name: str) -> str | None:
            v = params.get(name)
            if v is None or not str(v).strip():
                return None
            v = str(v).strip()
            if len(v) > MAX_TEXT:
                raise InvalidJobError(f"{name} is longer than {MAX_TEXT} characters")
            return v

        state = text("state")
        if state is not None and state not in STATES:
            raise InvalidJobError(f"unknown state {state!r}; one of {', '.join(STATES)}")
        parent = text("parent")
        pid: int | None = None
        if parent is not None:
            pid = parse_id(parent, "parent")
        tag = text("tag")
        return cls(state, text("group"), text("type"), pid, text("q"),
                   None if tag is None else check_tag(tag))

    def items(self) -> dict[str, str]:
        """The filters that are set, as query parameters."""
        out = {"state": self.state, "group": self.group, "type": self.type,
               "parent": None if self.parent is None else str(self.parent), "q": self.q,
               "tag": self.tag}
        return {k: v for k, v in out.items() if v is not None}

    @property
    def any(self) -> bool:
        return bool(self.items())


def parse_id(value: Any, name: str = "id") -> int:
    """A job id from text; raises InvalidJobError."""
    try:
        n = int(str(value))
    except ValueError:
        raise InvalidJobError(f"{name} must be a job id (a positive integer): {value!r}") from None
    if not 0 < n < 2**63:
        raise InvalidJobError(f"{name} must be a job id (a positive integer): {value!r}")
    return n


@dataclass
class JobRow:
    """One line of the job list."""

    id: int
    type: str
    kind: str
    state: str
    group: str
    attempts: int
    parent_id: int | None
    created_at: datetime
    finished_at: datetime | None
    error: str | None
    #: for the attempts' wording (aiojobqueue.attempts.attempts_short)
    max_attempts: int = 0
    attempt_limit: int = 0
    releases: int = 0


@dataclass
class JobPage:
    """A page of the job list, newest first."""

    rows: list[JobRow]
    #: Pass as ``before`` for the next (older) page; None: no older rows.
    next_before: int | None
    #: The ids this page looked at went down to here (a filtered page scans a window).
    scanned_to: int | None


@dataclass
class JobDetail:
    """Everything the job page shows."""

    job: Job
    checkpoint: Any
    timeout: float | None
    attempt_limit: int
    lease_expires_in: float | None
    cancel_requested: bool
    worker_seen_ago: float | None
    progress: Any
    errors: list[dict[str, Any]] | None
    children: dict[str, Count]
    dependents: list[tuple[int, str, str]]
    dependents_more: bool
    dependencies: list[tuple[int, str, str]]
    now: datetime
    #: ``explain()`` of the same row (None where it failed: the page shows the rest).
    why: Any = None


@dataclass
class Node:
    """A DAG node as fetched."""

    id: int
    type: str
    kind: str
    state: str
    parent_id: int | None
    group: str
    #: A second line drawn under the label (e.g. what an external step waits for).
    subtitle: str | None = None
    #: what the DAG view adds to the node's tooltip (an external step: waiting for whom,
    #: since when, until when; see dagreads.external_notes)
    note: str = ""


@dataclass
class Graph:
    """A job's DAG: nodes, dependency edges (upstream, downstream), container summaries."""

    focus: int
    nodes: dict[int, Node]
    edges: list[tuple[int, int]]
    #: Children of a container left out of ``nodes``: container id -> state -> count.
    hidden_children: dict[int, dict[str, int]] = field(default_factory=dict)
    #: Nodes of the DAG not fetched at all (past DAG_FETCH) or not drawn (past DAG_DRAW).
    truncated: bool = False
    #: An edge's run condition where it is not "done" (drawn dashed): (up, down) -> when.
    when: dict[tuple[int, int], str] = field(default_factory=dict)


@dataclass
class WorkerRow:
    """One registered worker."""

    id: str
    host: str
    pid: int
    started_at: datetime
    seen_ago: float
    running: int
    types: list[str] | None
    live: bool


@dataclass
class ScheduleRow:
    """One row of the schedules table (``every``: the period, ``every 5 s`` or ``cron
    ...``; None with ``type`` for a row no worker has declared yet)."""

    name: str
    type: str | None
    every: str | None
    last_slot: datetime | None
    last_state: str | None
    next_slot: datetime | None
    tz: str | None = None
    paused: bool = False



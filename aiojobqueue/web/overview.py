"""The overview page's reads: per-group backlog and fair share, the caps as gauges, the
last hour's throughput, each count a bounded index probe (see docs/dashboard.md). The caps,
weights, rates and pauses are the stored policy's (``policyreads.py``)."""

from __future__ import annotations

import functools
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, case, func, inspect, select
from sqlalchemy.ext.asyncio import AsyncConnection

from .. import schema as S
from ..policy_text import policy_data
from ..sql import in_state
from ..timeutil import UTCDateTime, as_utc, db_now
from . import policyreads as P
from . import views as V
from .reader import Reader, first_row
from .views import (
    AGE_PROBE,
    LEAF_COUNTED,
    LIVE_WORKER,
    MAX_GROUPS,
    RATE_PROBE,
    STATES,
    Count,
    GroupRow,
    Overview,
    count_of,
    lit,
)


class OverviewReads(Reader):
    """The overview's reads (a part of ``data.Data``)."""

    async def overview(self) -> Overview:
        """Per-group backlog and fair share, the caps as gauges, the last hour's throughput."""
        q, G = self.q, self.t.groups

        async def read(conn: AsyncConnection) -> Overview:
            now = (await conn.execute(select(db_now()))).scalar_one()
            covered = await self._per_group_indexed(conn)
            probed = [s for s in LEAF_COUNTED if s in covered]
            # a covering index leads with (state, group_key): its order
            firsts: list[Any] = [self._capped(s, order=self.t.jobs.c.group_key)
                                 for s in probed]
            totals_row = await first_row(conn, select(*firsts)) if firsts else ()
            totals = {s: count_of(int(n)) for s, n in zip(probed, totals_row, strict=True)}
            groups_total = int(await conn.scalar(select(func.count()).select_from(G)) or 0)
            names = [r[0] for r in await conn.execute(
                select(G.c.group_key).order_by(G.c.group_key).limit(MAX_GROUPS * 10))]
            per: dict[str, dict[str, Count]] = {g: {} for g in names}
            for state in LEAF_COUNTED:
                totals[state] = await self._group_counts(conn, state, totals.get(state), names,
                                                         per)
            # The busiest groups first; the page lists MAX_GROUPS.
            busy = sorted(names, key=lambda g: (
                -sum(c.n for s, c in per[g].items() if s != S.FAILED), -per[g][S.FAILED].n, g))
            shown = busy[:MAX_GROUPS]
            pol = await P.read_policy(conn, self.t)
            weights = await self._weights(conn, shown, per)
            weights.update({g: w for g in shown if (w := pol.group(g).weight) is not None})
            ages = await self._ready_ages(conn, now, [g for g in shown if per[g][S.READY].n])
            targets = P.targets(pol, weights, per, shown)
            used = await P.group_rate_used(conn, self.t, pol, shown)
            groups = []
            for g in shown:
                age, age_min = ages.get(g, (None, False))
                groups.append(GroupRow(
                    g, weights[g], per[g][S.RUNNING].n,
                    None if targets is None else targets[g], pol.group(g).cap, per[g], age,
                    age_min, rule=P.row_policy(pol, g, used)))
            gauges = await P.gauges(conn, self.t, pol, totals[S.RUNNING].n, q.limits)
            series, capped = await self._throughput(conn, now)
            live = int(await conn.scalar(select(func.count()).select_from(self.t.workers).where(
                self.t.workers.c.last_seen > now - timedelta(seconds=LIVE_WORKER))) or 0)
            return Overview(now, groups, groups_total, totals, gauges, series, capped, live,
                            policy_data(pol), targets is not None)

        return await self._read(read)

    async def _per_group_indexed(self, conn: AsyncConnection) -> set[str]:
        """The states some index leading with (state, group_key) covers (read once): their
        counts are capped probes per group. The others are counted in one GROUP BY, the
        single pass their rows cost without such an index."""
        if self._covered is None:
            name = self.t.jobs.name
            indexes = await conn.run_sync(lambda c: inspect(c).get_indexes(name))
            covered: set[str] = set()
            for ix in indexes:
                if list(ix["column_names"][:2]) != ["state", "group_key"]:
                    continue
                where = [str(v) for k, v in (ix.get("dialect_options") or {}).items()
                         if k.endswith("_where") and v is not None]
                covered |= ({st for st in STATES if any(f"'{st}'" in w for w in where)}
                            if where else set(STATES))
            self._covered = covered
        return self._covered

    async def _group_counts(self, conn: AsyncConnection, state: str, total: Count | None,
                            names: list[str], per: dict[str, dict[str, Count]]) -> Count:
        """Counts of ``state`` per group, and in all: one GROUP BY unless the state has more
        than CAP rows and an index by group (``total`` known), then a capped probe per
        group."""
        J = self.t.jobs
        if total is None or not total.capped:
            got: dict[str, int] = dict((await conn.execute(
                select(J.c.group_key, func.count()).where(*in_state(J, state))
                .group_by(J.c.group_key))).all())
            for g in names:
                per[g][state] = Count(int(got.get(g, 0)))
            return count_of(sum(got.values())) if total is None else total
        for i in range(0, len(names), 50):
            part = names[i : i + 50]
            def build(state: str = state, k: int = len(part)) -> Any:
                probes: list[Any] = [self._capped(state, J.c.group_key == bindparam(f"g{i}"),
                                                  cap=V.GROUP_CAP) for i in range(k)]
                return select(*probes)

            stmt = self._stmt(("count", state, len(part), V.GROUP_CAP), build)
            row = await first_row(conn, stmt, {f"g{i}": g for i, g in enumerate(part)})
            for g, n in zip(part, row, strict=True):
                per[g][state] = count_of(int(n), V.GROUP_CAP)
        return total

    async def _weights(self, conn: AsyncConnection, groups: list[str],
                       per: dict[str, dict[str, Count]]) -> dict[str, int]:
        """A group's weight: the largest among its ready jobs (the claim's rule), else among
        its running ones, else 1."""
        J = self.t.jobs
        out = dict.fromkeys(groups, 1)
        ready = [g for g in groups if per[g][S.READY].n]
        for i in range(0, len(ready), 50):
            part = ready[i : i + 50]
            def build(k: int = len(part)) -> Any:
                tops: list[Any] = [
                    select(J.c.weight).where(J.c.state == lit(S.READY),
                                             J.c.group_key == bindparam(f"g{i}"), J.c.weight > 1)
                    .order_by(J.c.weight.desc()).limit(1).scalar_subquery() for i in range(k)]
                return select(*tops)

            stmt = self._stmt(("weight", len(part)), build)
            row = await first_row(conn, stmt, {f"g{i}": g for i, g in enumerate(part)})
            for g, w in zip(part, row, strict=True):
                out[g] = int(w) if w is not None else 1
        running = [g for g in groups if per[g][S.RUNNING].n and not per[g][S.READY].n]
        if running:
            for g, w in await conn.execute(
                select(J.c.group_key, func.max(J.c.weight))
                .where(J.c.state == lit(S.RUNNING), J.c.group_key.in_(running))
                .group_by(J.c.group_key)):
                out[g] = int(w)
        return out

    async def _ready_ages(self, conn: AsyncConnection, now: datetime,
                          groups: list[str]) -> dict[str, tuple[float, bool]]:
        """Seconds since the oldest ready job of each group became due (enqueued, or its
        run_after). Looks at the AGE_PROBE next-to-run jobs of a group (the claim's index
        order); past that the age is a lower bound."""
        J = self.t.jobs
        since = case((J.c.run_after > J.c.created_at, J.c.run_after), else_=J.c.created_at)
        out: dict[str, tuple[float, bool]] = {}
        for i in range(0, len(groups), 25):
            part = groups[i : i + 25]
            def build(k: int = len(part)) -> Any:
                cols: list[Any] = []
                for i in range(k):
                    inner = (select(since.label("since"))
                             .where(J.c.state == lit(S.READY),
                                    J.c.group_key == bindparam(f"g{i}"))
                             .order_by(J.c.priority.desc(), J.c.id).limit(AGE_PROBE + 1)
                             .subquery())
                    cols += [select(func.min(inner.c.since)).scalar_subquery(),
                             select(func.count()).select_from(inner).scalar_subquery()]
                return select(*cols)

            stmt = self._stmt(("age", len(part)), build)
            row = await first_row(conn, stmt, {f"g{i}": g for i, g in enumerate(part)})
            for k, g in enumerate(part):
                first, n = row[2 * k], int(row[2 * k + 1])
                if first is not None:
                    t = as_utc(first)
                    out[g] = (max((now - t).total_seconds(), 0.0), n > AGE_PROBE)
        return out

    async def _throughput(self, conn: AsyncConnection,
                          now: datetime) -> tuple[list[tuple[datetime, int, int]], bool]:
        """Done and failed per minute over the last hour: one bounded index range per state,
        counted by 61 cumulative CASEs (no dialect's date functions needed)."""
        J = self.t.jobs
        end = now.replace(second=0, microsecond=0) + timedelta(minutes=1)
        bounds = [end - timedelta(minutes=60 - i) for i in range(61)]

        def build(state: str) -> Any:
            inner = (select(J.c.finished_at.label("f"))
                     .where(J.c.state == lit(state),
                            J.c.finished_at >= bindparam("b0", type_=UTCDateTime()))
                     .order_by(J.c.finished_at.desc()).limit(RATE_PROBE).subquery())
            cols: list[Any] = [
                func.count(case((inner.c.f >= bindparam(f"b{i}", type_=UTCDateTime()), 1)))
                for i in range(61)]
            return select(*cols).select_from(inner)

        params = {f"b{i}": b for i, b in enumerate(bounds)}
        counts: dict[str, list[int]] = {}
        capped = False
        for state in (S.DONE, S.FAILED):
            stmt = self._stmt(("rate", state, RATE_PROBE), functools.partial(build, state))
            cum = [int(x) for x in await first_row(conn, stmt, params)]
            capped = capped or cum[0] >= RATE_PROBE
            counts[state] = [cum[i] - cum[i + 1] for i in range(60)]
        series = [(bounds[i], counts[S.DONE][i], counts[S.FAILED][i]) for i in range(60)]
        return series, capped


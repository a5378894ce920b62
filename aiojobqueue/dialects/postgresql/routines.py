"""The one-call finalize routines of PostgreSQL, whose PL/pgSQL lives beside this module
(``finish.sql``, ``split.sql``, ``release.sql``, ``rest.sql``, ``released_rows.sql``: bodies
with ``$name`` placeholders for the statements and names the core builds).

Three PL/pgSQL functions. ``<name>_rel(ids)`` releases the dependents of the
finished ``ids`` (the statement of settle.drop_deps_stmt; finish_detailed() calls
it too) and sends the wake-up if one became ready. It runs with nested loops off: on
a table the planner has no statistics for yet it takes the finished jobs' dependents
for one row and would re-scan the edge counts once per dependent (quadratic: 2.8 s
to release a fan-out of 5,000, 63 ms with a hash join).

``<name>(ids, attempt, owner, results)``: the fenced done UPDATE (storing the
results), then what settle() does in the common cases: the same release (in line: a
nested call costs ~0.1 ms; nested loops off here too, and none of its other
statements joins), the activation of containers it releases, the roll-up of
containers whose last child finished, round after round. A VOLATILE function takes a
fresh snapshot for each statement (READ COMMITTED), so the release reads every edge
committed before the finished rows were locked (the UPDATE holds them), as the
statements of finish_detailed() do in one transaction; an edge added later waits for
those locks and then sees the job done; a roll-up reads the children after locking
the container. Called in autocommit, the whole call is one transaction and one round
trip. Where a child failed or was cancelled (cancellations to propagate), or an
activated container holds another container or may be empty, it raises inside its
own block, so everything it did is undone, and returns NULLs: the caller then takes
the long path. Else it returns the ids it finished, and, where ``p_n > 0``, leases
up to ``p_n`` ready jobs of group ``p_g`` and types ``p_types`` to ``p_lo`` for
``p_ttl`` seconds by the statement claim() runs for its known group (a fresh
snapshot: the jobs this call released are among them) and returns them as a JSON
array of claim_columns() rows: the next step of a DAG leased in the call that made it
runnable, one round trip less. Where ``p_n < 0`` (a counted cap's hand-over, see
Slots.hand_ask) it leases at most ``-p_n`` and at most as many jobs as the call
finished, so the count the cap holds never grows: no gate to take.

A split release (``split`` > 0): where the call finished one job on which more than
``max(4 * p_n, split)`` jobs wait (none of them a container), it releases only that
many, the first in claim order (priority, then id), and records the others in the
releases table in parts of at most ``part`` jobs, in the same transaction, returning
the finished job's id as ``o_rest``. The caller then calls ``<name>_rest(1)`` on
another connection until it returns 0: each call takes the first part (SKIP
LOCKED), releases its jobs and deletes it, one transaction. So the release of a wide
fan-out no longer holds up the first of its jobs, and the rest of its writing runs
beside them. A part left by a worker that died is taken by any worker's next sweep.
``release_one(ids)`` builds the statement that takes the one edge to the finished
job off each of those jobs ((job, upstream) is the edges' key).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import cache
from importlib.resources import files
from string import Template
from typing import Any

from sqlalchemy import (
    BigInteger,
    Float,
    Integer,
    Text,
    any_,
    bindparam,
    column,
    func,
    literal,
    literal_column,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.functions import Function

from ...schema import CANCELLED, CONTAINER, DONE, FAILED, LIVE, ONFAIL, READY, WAITING, Tables

#: Every statement in them is meant to walk an index (the primary key, the edges', the
#: ready and parent indexes); on a table whose statistics are stale (just loaded, not
#: analysed yet) the planner would scan it whole for a release of a few hundred ids by
#: primary key (5 ms on 20,000 rows against 2 ms). Generic plans: each statement is planned
#: once per session, not at every call (a custom plan, re-planned per call, weighs every
#: index of the jobs table again: about 3 us of server CPU per job of a DAG drain).
PLAN = ("SET enable_nestloop = off SET enable_seqscan = off "
        "SET plan_cache_mode = force_generic_plan")


@cache
def _body(name: str) -> Template:
    """A routine body (package data of this package)."""
    text = files(__package__).joinpath(f"{name}.sql").read_text(encoding="utf-8")
    return Template(text.removesuffix("\n"))


def settle_routine(
    t: Tables, channel: str, finish: Callable[[Any, Any, Any, Any], Any],
    release: Callable[[Any], Any], activate: Callable[[Any], Any],
    lease: Callable[[Any, Any, Any, Any, Any], Any],
    release_one: Callable[[Any], Any] | None = None, split: int = 0, part: int = 256,
) -> tuple[str, list[str]]:
    """(name, DDL) of the three routines (see the module docstring), their statements built
    by the given builders from the expressions of the routines' own variables."""
    sql = _compiler()
    jobs = t.jobs.name
    # p_results: NULL (no job returned anything) or a JSON array in p_ids' order, whose
    # nulls are stored as SQL NULL like the long path's (quadratic look-up, but p_ids holds
    # at most one round's CHUNK and is usually tens)
    result: Any = literal_column(
        f"CASE WHEN p_results IS NOT NULL THEN NULLIF(p_results -> "
        f"(array_position(p_ids, {jobs}.id) - 1), 'null'::jsonb) END")
    leased = lease(literal_column("p_g"), literal_column("v_n"),
                   lambda col: col == any_(literal_column("p_types")),
                   literal_column("p_lo"), literal_column("p_ttl"))
    names = dict(
        CANCELLED=CANCELLED, CONTAINER=CONTAINER, DONE=DONE, FAILED=FAILED, READY=READY,
        ONFAIL=ONFAIL,
        WAITING=WAITING, jobs=jobs, deps=t.deps.name, rels=t.releases.name, channel=channel,
        live=", ".join(f"'{x}'" for x in LIVE), split=int(split), part=int(part),
        row=", ".join(f"l.{c.name}" for c in leased.exported_columns),
        release_p_ids=sql(release(_ids("p_ids"))), release_v_rel=sql(release(_ids("v_rel"))),
        activate_v_act=sql(activate(_ids("v_act"))), lease=sql(leased),
        finish_p_ids=sql(finish(_ids("p_ids"), literal_column("p_a"), literal_column("p_o"),
                                result)),
    )
    rel_body = _body("release").substitute(names)
    split_sql = rest_body = ""
    if split and release_one is not None:
        one = sql(release_one(_ids("v_deps")))
        # what the split and the rest read of a release's rows (no container is released)
        agg = _body("released_rows").substitute(names)
        split_sql = _body("split").substitute(names, one=one, agg=agg)
        rest_body = _body("rest").substitute(names, one=one, agg=agg)
    body = _body("finish").substitute(names, split_block=split_sql)
    digest = hashlib.sha1((PLAN + rel_body + body + rest_body).encode()).hexdigest()[:10]
    name = f"{jobs}_settle_{digest}"
    return name, _ddl(name, rel_body, body, rest_body)


def _compiler() -> Callable[[Any], str]:
    """Renders a statement as PostgreSQL text with its values inline (a routine body is
    text: it has no bind parameters)."""
    from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg

    dialect = PGDialect_asyncpg()  # type: ignore[no-untyped-call]

    def sql(stmt: Any) -> str:
        return str(stmt.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))
    return sql


def _ids(var: str) -> Callable[[Any], Any]:
    """The id match of a statement builder for the routine's id array variable ``var``."""
    return lambda col: col == any_(literal_column(var))


def _ddl(name: str, rel_body: str, body: str, rest_body: str) -> list[str]:
    """The CREATE statements of the routines ``name``_rel, ``name`` and ``name``_rest, from
    their bodies (``rest_body`` empty: no split release, that routine returns 0)."""
    rel = f"{name}_rel"
    return [
        f"CREATE OR REPLACE FUNCTION {rel}(p_ids bigint[]) RETURNS TABLE(id bigint, "
        f"kind text, state text, parent_id bigint) LANGUAGE plpgsql VOLATILE "
        f"{PLAN} AS $ajq${rel_body}\n$ajq$",
        f"CREATE OR REPLACE FUNCTION {name}(p_ids bigint[], p_a integer, p_o text, "
        f"p_results jsonb, p_g text, p_types text[], p_n integer, p_lo text, "
        f"p_ttl double precision, OUT o_done bigint[], OUT o_leased jsonb, "
        f"OUT o_rest bigint) "
        f"LANGUAGE plpgsql VOLATILE {PLAN} AS $ajq${body}\n$ajq$",
        f"CREATE OR REPLACE FUNCTION {name}_rest(p_n integer) RETURNS integer "
        f"LANGUAGE plpgsql VOLATILE {PLAN} "
        f"AS $ajq${rest_body or ' BEGIN RETURN 0; END'}\n$ajq$",
    ]


def settle_calls(name: str, json_param: Callable[[str], Any]) -> tuple[Any, Any, Any]:
    """The statements calling the routines ``name`` (see DialectOps.settle_calls)."""
    ids = bindparam("ids", type_=ARRAY(BigInteger))
    call = Function(name, ids, bindparam("a", type_=Integer()), bindparam("o", type_=Text()),
                    json_param("r"), bindparam("g", type_=Text()),
                    bindparam("types", type_=ARRAY(Text)), bindparam("n", type_=Integer()),
                    bindparam("lo", type_=Text()), bindparam("ttl", type_=Float())
                    ).table_valued(column("o_done", ARRAY(BigInteger)),
                                   column("o_leased", JSONB), column("o_rest", BigInteger))
    finish = select(call.c.o_done, call.c.o_leased, call.c.o_rest)
    rel = Function(f"{name}_rel", ids).table_valued(
        column("id", BigInteger), column("kind", Text), column("state", Text),
        column("parent_id", BigInteger))
    rest = select(Function(f"{name}_rest", bindparam("n", type_=Integer()),
                           type_=Integer()))
    return finish, select(rel.c.id, rel.c.kind, rel.c.state, rel.c.parent_id), rest


async def routine_exists(conn: AsyncConnection, name: str) -> bool:
    """Whether the routine ``name`` is installed."""
    found = await conn.execute(select(func.to_regproc(literal(name, Text())).is_not(None)))
    return bool(found.scalar())


def fair_pick_sql(jobs: str, with_after: bool) -> str:
    """fair_pick.sql for the jobs table ``jobs``: after the cursor ``:after`` (rotation),
    or, without one, from the first name (see DialectOps.fair_pick_sql)."""
    if with_after:
        after = "(:after)::varchar"
        parts = {"after": after, "sb_more": f"sb.g <= {after}",
                 "a_done": "EXISTS (SELECT 1 FROM sa WHERE g IS NULL)", "first": "sa",
                 "wrap": f"UNION ALL SELECT g FROM sb WHERE g IS NOT NULL AND g <= {after}"
                         " AND (SELECT v FROM a_done)",
                 "b_end": f"g IS NULL OR g > {after}", "tie": f"(c.g <= {after}),"}
    else:  # sa is never read
        parts = {"after": "NULL", "sb_more": "true", "a_done": "true", "first": "sb",
                 "wrap": "", "b_end": "g IS NULL", "tie": ""}
    return _body("fair_pick").substitute(parts, jobs=jobs)

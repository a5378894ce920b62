"""PostgreSQL: one UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING,
and LISTEN/NOTIFY on a dedicated connection outside the pool to wake idle workers.

Behind a transaction pooler (PgBouncer ``pool_mode = transaction``) each transaction may
run on another server connection, so nothing may outlive one: no session ``SET`` (only
function-level ``SET`` in the routines below), no session advisory lock, no prepared
statement kept across transactions. pooler_connect_args() finds such a pooler when the
queue connects and turns the statement caches off; the listener checks that its own
notification comes back and otherwise says so once and leaves the worker polling.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

from sqlalchemy import (
    BigInteger,
    Float,
    Integer,
    Select,
    Text,
    any_,
    bindparam,
    cast,
    column,
    func,
    literal,
    literal_column,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool
from sqlalchemy.sql.functions import Function
from sqlalchemy.util import greenlet_spawn

from ..errors import ConfigurationError
from .base import DialectOps, JobColumns, Listener, WakeCallback, varying_fields

log = logging.getLogger("aiojobqueue.listener")

#: asyncpg options under a transaction pooler: SQLAlchemy's statement cache off (it would
#: keep named statements across transactions) and asyncpg's too, which makes asyncpg prepare
#: each statement unnamed: Parse/Describe/Flush, then Bind/Execute/Sync, so the pooler keeps
#: one server connection for both, and no name can clash with another client's on a shared
#: server connection. Costs a round trip and a parse per statement.
POOLED_CONNECT_ARGS: dict[str, Any] = {"statement_cache_size": 0,
                                       "prepared_statement_cache_size": 0}
#: seconds the listener waits for its own NOTIFY before it concludes none will come
PROBE_WAIT = 5.0


async def _pids(conn: AsyncConnection) -> tuple[int, int]:
    """(the backend pid the connection announced at start-up, the server's own)."""
    raw = await conn.get_raw_connection()
    apg: Any = raw.driver_connection
    real = (await conn.exec_driver_sql("SELECT pg_backend_pid()")).scalar_one()
    return int(apg.get_server_pid()), int(real)


async def pooler_connect_args(url: URL) -> dict[str, Any]:
    """POOLED_CONNECT_ARGS where ``url`` reaches PostgreSQL through a pooler, else {}.

    A pooler (PgBouncer, and the others that multiplex) hands the client a made-up backend
    key at start-up, since the client never owns a server connection: the pid the
    connection announced is not the pid ``pg_backend_pid()`` reports. The probe runs on a
    throwaway connection that itself prepares nothing by name."""
    engine = create_async_engine(url, poolclass=NullPool, connect_args=POOLED_CONNECT_ARGS)
    try:
        async with engine.connect() as conn:
            announced, real = await _pids(conn)
    finally:
        await engine.dispose()
    return dict(POOLED_CONNECT_ARGS) if announced != real else {}

# deadlock, serialization failure, lock timeout, admin shutdown, cannot connect now
_TRANSIENT = {"40P01", "40001", "55P03", "57P01", "57P02", "57P03", "08000", "08003", "08006"}


class PostgresOps(DialectOps):
    name = "postgresql"
    autocommit_insert = True
    autocommit_writes = True

    def _insert_ignore(self, table: Any) -> Any:
        return pg_insert(table).on_conflict_do_nothing()

    def in_ids(self, col: Any, ids: Sequence[int]) -> Any:
        return col == any_(literal(list(ids), ARRAY(BigInteger)))

    def in_ids_param(self, col: Any, name: str) -> Any:
        return col == any_(bindparam(name, type_=ARRAY(BigInteger)))

    def in_select(self, col: Any, sel: Select[Any]) -> Any:
        # "= ANY(ARRAY(sub-select))": an InitPlan feeding an index scan. A plain IN becomes a
        # semi-join, and the generic plan guesses the sub-select large: hash join over a
        # sequential scan of the whole jobs table.
        return col == any_(func.array(sel.scalar_subquery()))

    def skip_locked(self, stmt: Select[Any]) -> Select[Any]:
        return stmt.with_for_update(skip_locked=True)

    def for_update(self, stmt: Select[Any]) -> Select[Any]:
        return stmt.with_for_update()

    async def notify(self, conn: AsyncConnection, payload: str = "") -> None:
        await conn.execute(select(func.pg_notify(self.channel(), payload)))

    def notify_expr(self) -> Any:
        # Evaluated once per returned row, but NOTIFY collapses identical notifications of
        # one transaction into one.
        return func.pg_notify(self.channel(), "")

    def settle_routine(
        self, finish: Callable[[Any, Any, Any, Any], Any], release: Callable[[Any], Any],
        activate: Callable[[Any], Any], lease: Callable[[Any, Any, Any, Any, Any], Any],
        release_one: Callable[[Any], Any] | None = None, split: int = 0, part: int = 256,
    ) -> tuple[str, list[str]]:
        """Three PL/pgSQL functions. ``<name>_rel(ids)`` releases the dependents of the
        finished ``ids`` (the statement of Completer._drop_deps_stmt; finish_detailed() calls
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
        runnable, one round trip less.

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
        job off each of those jobs ((job, upstream) is the edges' key)."""
        from sqlalchemy.dialects.postgresql.asyncpg import PGDialect_asyncpg

        dialect = PGDialect_asyncpg()  # type: ignore[no-untyped-call]

        def sql(stmt: Any) -> str:
            return str(stmt.compile(dialect=dialect, compile_kwargs={"literal_binds": True}))

        def ids(var: str) -> Callable[[Any], Any]:
            return lambda col: col == any_(literal_column(var))

        from ..schema import CANCELLED, CONTAINER, DONE, FAILED, LIVE, READY, WAITING

        jobs = self.t.jobs.name
        # p_results: NULL (no job returned anything) or a JSON array in p_ids' order, whose
        # nulls are stored as SQL NULL like the long path's (quadratic look-up, but p_ids
        # holds at most one round's CHUNK and is usually tens)
        result: Any = literal_column(
            f"CASE WHEN p_results IS NOT NULL THEN NULLIF(p_results -> "
            f"(array_position(p_ids, {jobs}.id) - 1), 'null'::jsonb) END")
        live = ", ".join(f"'{x}'" for x in LIVE)
        rel_body = f"""
#variable_conflict use_column
DECLARE
  v_id bigint[]; v_kind text[]; v_state text[]; v_parent bigint[]; v_ready boolean;
BEGIN
  WITH r AS ({sql(release(ids("p_ids")))})
  SELECT array_agg(r.id), array_agg(r.kind::text), array_agg(r.state::text),
         array_agg(r.parent_id),
         coalesce(bool_or(r.kind <> '{CONTAINER}' AND r.state = '{READY}'), false)
    INTO v_id, v_kind, v_state, v_parent, v_ready FROM r;
  IF v_ready THEN
    PERFORM pg_notify('{self.channel()}', '');
  END IF;
  RETURN QUERY SELECT * FROM unnest(v_id, v_kind, v_state, v_parent);
END"""
        leased = lease(literal_column("p_g"), literal_column("p_n"),
                       lambda col: col == any_(literal_column("p_types")),
                       literal_column("p_lo"), literal_column("p_ttl"))
        row = ", ".join(f"l.{c.name}" for c in leased.exported_columns)
        rels = self.t.releases.name
        deps = self.t.deps.name
        split_sql = rest_body = ""
        if split and release_one is not None:
            one = sql(release_one(ids("v_deps")))
            # what the loop below reads of a release's rows (no container is released here)
            agg = f"""SELECT coalesce(array_agg(DISTINCT r.parent_id)
                   FILTER (WHERE r.kind <> '{CONTAINER}' AND r.parent_id IS NOT NULL), '{{}}'),
             coalesce(bool_or(r.kind <> '{CONTAINER}' AND r.state = '{READY}'), false)"""
            split_sql = f"""
  -- a wide fan-out: release its first jobs here, record the rest in parts (see above)
  IF cardinality(v_rel) = 1 THEN
    v_split := greatest(4 * p_n, {int(split)});
    IF (SELECT count(*) FROM (SELECT 1 FROM {deps} d WHERE d.depends_on_id = v_rel[1]
                              LIMIT v_split + 1) s) > v_split THEN
      SELECT array_agg(j.id ORDER BY j.priority DESC, j.id)
               FILTER (WHERE j.kind <> '{CONTAINER}' AND j.state = '{WAITING}'),
             coalesce(bool_or(j.kind = '{CONTAINER}'), false)
        INTO v_deps, v_boxes
        FROM {jobs} j
       WHERE j.id = ANY(ARRAY(SELECT d.job_id FROM {deps} d WHERE d.depends_on_id = v_rel[1]));
      IF NOT v_boxes AND cardinality(v_deps) > v_split THEN
        INSERT INTO {rels} (job_id, ids, created_at)
          SELECT v_rel[1], to_jsonb(v_deps[s + 1 : s + {int(part)}]), statement_timestamp()
            FROM generate_series(v_split, cardinality(v_deps) - 1, {int(part)}) s ORDER BY s;
        o_rest := v_rel[1];
        v_deps := v_deps[1:v_split];
        WITH r AS ({one})
        {agg}
          INTO v_b, v_r FROM r;
        v_busy := v_busy || v_b;
        v_ready := v_ready OR v_r;
        v_rel := '{{}}';
      END IF;
    END IF;
  END IF;"""
            rest_body = f"""
DECLARE
  v_deps bigint[]; v_b bigint[]; v_r boolean; v_ready boolean := false; v_n integer := 0;
BEGIN
  FOR v_deps IN
    DELETE FROM {rels} WHERE id IN (
      SELECT id FROM {rels} ORDER BY id LIMIT p_n FOR UPDATE SKIP LOCKED)
    RETURNING ARRAY(SELECT jsonb_array_elements_text(ids)::bigint)
  LOOP
    WITH r AS ({one})
    {agg}
      INTO v_b, v_r FROM r;
    v_ready := v_ready OR v_r;
    v_n := v_n + 1;
  END LOOP;
  IF v_ready THEN
    PERFORM pg_notify('{self.channel()}', '');
  END IF;
  RETURN v_n;
END"""
        body = f"""
DECLARE
  v_ids bigint[]; v_rel bigint[]; v_parents bigint[]; v_next bigint[];
  v_busy bigint[] := '{{}}'; v_act bigint[] := '{{}}'; v_kids bigint[]; v_b bigint[];
  v_ready boolean := false; v_r boolean; v_nested boolean; v_p bigint; v_pp bigint;
  v_deps bigint[]; v_boxes boolean; v_split integer;
BEGIN
  WITH u AS ({sql(finish(ids("p_ids"), literal_column("p_a"), literal_column("p_o"), result))})
  SELECT coalesce(array_agg(u.id), '{{}}'),
         coalesce(array_agg(u.id) FILTER (WHERE u.has_dependents), '{{}}'),
         coalesce(array_agg(DISTINCT u.parent_id) FILTER (WHERE u.parent_id IS NOT NULL), '{{}}')
    INTO v_ids, v_rel, v_parents FROM u;
{split_sql}
  -- settle() in rounds: release what waits on v_rel, activate the containers that releases,
  -- roll up the parents no live child job held here keeps open; the rolled-up containers
  -- are the next round's v_rel, their parents its candidates
  LOOP
    IF cardinality(v_rel) > 0 THEN
      WITH r AS ({sql(release(ids("v_rel")))})
      SELECT coalesce(array_agg(DISTINCT r.parent_id)
                        FILTER (WHERE r.kind <> '{CONTAINER}' AND r.parent_id IS NOT NULL), '{{}}'),
             coalesce(array_agg(r.id) FILTER (WHERE r.kind = '{CONTAINER}'
                                                AND r.state <> '{WAITING}'), '{{}}'),
             coalesce(bool_or(r.kind <> '{CONTAINER}' AND r.state = '{READY}'), false)
        INTO v_b, v_act, v_r FROM r;
      v_busy := v_busy || v_b;
      v_ready := v_ready OR v_r;
    END IF;
    IF cardinality(v_act) > 0 THEN
      WITH k AS ({sql(activate(ids("v_act")))})
      SELECT coalesce(bool_or(k.kind = '{CONTAINER}' AND k.state <> '{WAITING}'), false),
             coalesce(array_agg(DISTINCT k.parent_id) FILTER (WHERE k.kind <> '{CONTAINER}'),
                      '{{}}'),
             coalesce(bool_or(k.kind <> '{CONTAINER}' AND k.state = '{READY}'), false)
        INTO v_nested, v_kids, v_r FROM k;
      -- a container activated in turn, or one that may be empty (to roll up at once): the
      -- long path's
      IF v_nested OR EXISTS (SELECT unnest(v_act) EXCEPT SELECT unnest(v_kids)) THEN
        RAISE EXCEPTION USING ERRCODE = 'AJQ01';
      END IF;
      v_busy := v_busy || v_kids;
      v_ready := v_ready OR v_r;
      v_act := '{{}}';
    END IF;
    -- a parent with a live child job this call holds locked cannot finish before it commits
    v_parents := ARRAY(SELECT unnest(v_parents) EXCEPT SELECT unnest(v_busy) ORDER BY 1);
    v_rel := '{{}}';
    v_next := '{{}}';
    IF cardinality(v_parents) > 0 THEN
      PERFORM 1 FROM {jobs} WHERE id = ANY(v_parents) ORDER BY id FOR UPDATE;
      FOREACH v_p IN ARRAY v_parents LOOP
        PERFORM 1 FROM {jobs} WHERE id = v_p AND state IN ({live});
        CONTINUE WHEN NOT FOUND;  -- ended already (cancelled, say)
        PERFORM 1 FROM {jobs} WHERE parent_id = v_p AND state IN ({live}) LIMIT 1;
        CONTINUE WHEN FOUND;
        -- a failed or cancelled child fails the container and cancels what waits on it
        PERFORM 1 FROM {jobs} WHERE parent_id = v_p AND state IN ('{FAILED}', '{CANCELLED}')
          LIMIT 1;
        IF FOUND THEN
          RAISE EXCEPTION USING ERRCODE = 'AJQ01';
        END IF;
        UPDATE {jobs} SET state = '{DONE}', error = NULL, finished_at = statement_timestamp(),
                          live_key = NULL
          WHERE id = v_p RETURNING parent_id INTO v_pp;
        v_rel := v_rel || v_p;
        IF v_pp IS NOT NULL THEN
          v_next := v_next || v_pp;
        END IF;
      END LOOP;
    END IF;
    EXIT WHEN cardinality(v_rel) = 0;
    v_parents := v_next;
  END LOOP;
  IF p_n > 0 THEN
    WITH l AS ({sql(leased)})
    SELECT coalesce(jsonb_agg(jsonb_build_array({row})), '[]') INTO o_leased FROM l;
  END IF;
  IF v_ready THEN
    PERFORM pg_notify('{self.channel()}', '');
  END IF;
  o_done := v_ids;
  RETURN;
EXCEPTION WHEN SQLSTATE 'AJQ01' THEN
  o_done := NULL;
  o_leased := NULL;
  o_rest := NULL;
  RETURN;
END"""
        # Every statement in them is meant to walk an index (the primary key, the edges',
        # the ready and parent indexes); on a table whose statistics are stale (just loaded,
        # not analysed yet) the planner would scan it whole for a release of a few hundred ids
        # by primary key (5 ms on 20,000 rows against 2 ms).
        plan = "SET enable_nestloop = off SET enable_seqscan = off"
        digest = hashlib.sha1((plan + rel_body + body + rest_body).encode()).hexdigest()[:10]
        name = f"{jobs}_settle_{digest}"
        rel = f"{name}_rel"
        return name, [
            f"CREATE OR REPLACE FUNCTION {rel}(p_ids bigint[]) RETURNS TABLE(id bigint, "
            f"kind text, state text, parent_id bigint) LANGUAGE plpgsql VOLATILE "
            f"{plan} AS $ajq${rel_body}\n$ajq$",
            f"CREATE OR REPLACE FUNCTION {name}(p_ids bigint[], p_a integer, p_o text, "
            f"p_results jsonb, p_g text, p_types text[], p_n integer, p_lo text, "
            f"p_ttl double precision, OUT o_done bigint[], OUT o_leased jsonb, "
            f"OUT o_rest bigint) "
            f"LANGUAGE plpgsql VOLATILE {plan} AS $ajq${body}\n$ajq$",
            f"CREATE OR REPLACE FUNCTION {name}_rest(p_n integer) RETURNS integer "
            f"LANGUAGE plpgsql VOLATILE {plan} "
            f"AS $ajq${rest_body or ' BEGIN RETURN 0; END'}\n$ajq$",
        ]

    def settle_calls(self, name: str) -> tuple[Any, Any, Any]:
        ids = bindparam("ids", type_=ARRAY(BigInteger))
        call = Function(name, ids, bindparam("a", type_=Integer()), bindparam("o", type_=Text()),
                        self.json_param("r"), bindparam("g", type_=Text()),
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

    async def routine_exists(self, conn: AsyncConnection, name: str) -> bool:
        found = await conn.execute(select(func.to_regproc(literal(name, Text())).is_not(None)))
        return bool(found.scalar())

    async def check_server(self, conn: AsyncConnection) -> None:
        """Behind a pooler, an engine that keeps prepared statements (one the caller built
        without POOLED_CONNECT_ARGS) fails at random later: refuse it now."""
        announced, real = await _pids(conn)
        if announced == real:
            return
        raw = await conn.get_raw_connection()
        adapted: Any = raw.dbapi_connection
        apg: Any = raw.driver_connection
        caching = (getattr(adapted, "_prepared_statement_cache", None) is not None
                   or bool(getattr(apg, "_stmt_cache_enabled", False)))
        if caching:
            raise ConfigurationError(
                "this engine reaches PostgreSQL through a connection pooler (the backend pid "
                "differs from the one the connection announced) but keeps prepared "
                "statements, which a transaction pooler breaks: create it with "
                f"connect_args={POOLED_CONNECT_ARGS!r}, or pass the URL to JobQueue")

    def listener(self, engine: AsyncEngine) -> Listener:
        return _PgListener(engine, self.channel(), self.listen_url, self._deaf)

    @cached_property
    def _deaf(self) -> list[bool]:
        """[whether this queue's listener already said notifications do not arrive]"""
        return [False]

    def _is_transient(self, exc: BaseException) -> bool:
        if isinstance(exc, DBAPIError):
            code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
            if code in _TRANSIENT:
                return True
            cause = exc.orig.__cause__ if exc.orig is not None else None
            name = type(cause).__name__ if cause is not None else ""
            return "Connection" in name or "CannotConnect" in name
        return False

    def json_param(self, name: str) -> Any:
        return cast(bindparam(name, type_=Text()), JSONB)

    # (column, array type) in the order of the statement's parameters
    _BULK = (
        ("type", "text"), ("kind", "text"), ("state", "text"), ("args", "text"),
        ("parent_id", "int8"), ("group_key", "text"), ("weight", "int4"), ("priority", "int4"),
        ("pending", "int4"), ("max_attempts", "int4"), ("timeout", "float8"), ("key", "text"),
        ("cancelled_by", "int8"), ("has_dependents", "bool"), ("error", "text"),
        ("delay", "float8"), ("run_at", "timestamptz"), ("dead", "bool"),
    )

    async def insert_jobs_alone(
        self, engine: AsyncEngine, cols: JobColumns, wake: bool
    ) -> list[int]:
        """The bulk statement straight on a pooled connection's asyncpg link: a lone enqueue()
        is one round trip, and SQLAlchemy's Connection (checkout events, execution context,
        result wrapping: more CPU than the statement itself) is skipped, and with it the
        engine's cursor events. No transaction is ever open on that link, so the statement
        commits by itself; errors come out as SQLAlchemy would raise them.

        The link is kept as a spare for the next lone enqueue (a pool checkout and checkin
        cost about as much CPU as the statement): it goes back to the pool after SPARE_IDLE
        seconds without one, on release(), or at once if it failed. Concurrent callers
        check out their own."""
        sql, params = self._bulk_statement(cols, wake)
        fairy, self._spare = self._spare, None
        if fairy is None:
            fairy = await engine.raw_connection()
        apg: Any = fairy.driver_connection
        for _ in range(3):  # a link the server already closed: nothing sent yet, take another
            if not apg.is_closed():
                break
            await greenlet_spawn(fairy.invalidate)
            await greenlet_spawn(fairy.close)
            fairy = await engine.raw_connection()
            apg = fairy.driver_connection
        try:
            row = await apg.fetchrow(sql, *params)
        except Exception as exc:
            try:
                wrapped = await self._wrap_error(fairy, engine, exc, sql, params)
            finally:
                await greenlet_spawn(fairy.close)
            if wrapped is exc:
                raise
            raise wrapped from exc
        except BaseException:  # cancelled mid-statement: the link's state is unknown
            await greenlet_spawn(fairy.invalidate)
            await greenlet_spawn(fairy.close)
            raise
        if self._spare is None:
            self._keep_spare(fairy)
        else:  # another caller's link is the spare already
            await greenlet_spawn(fairy.close)
        return list(row[0])

    #: seconds a spare link of insert_jobs_alone stays out of the pool unused
    SPARE_IDLE = 0.5
    _spare: Any = None
    _spare_used = 0.0
    _spare_timer: asyncio.TimerHandle | None = None

    @cached_property
    def _closing(self) -> set[asyncio.Task[Any]]:
        """Spare links being given back by the idle timer (held: tasks are weakly kept)."""
        return set()

    def _keep_spare(self, fairy: Any) -> None:
        loop = asyncio.get_running_loop()
        self._spare, self._spare_used = fairy, loop.time()
        if self._spare_timer is None:
            self._spare_timer = loop.call_later(self.SPARE_IDLE, self._spare_idle)

    def _spare_idle(self) -> None:
        self._spare_timer = None
        if self._spare is None:
            return
        loop = asyncio.get_running_loop()
        left = self._spare_used + self.SPARE_IDLE - loop.time()
        if left > 0:  # used since: look again later
            self._spare_timer = loop.call_later(left, self._spare_idle)
            return
        fairy, self._spare = self._spare, None
        task = loop.create_task(greenlet_spawn(fairy.close))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def release(self) -> None:
        if self._spare_timer is not None:
            self._spare_timer.cancel()
            self._spare_timer = None
        fairy, self._spare = self._spare, None
        if fairy is not None:
            await greenlet_spawn(fairy.close)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    @staticmethod
    async def _wrap_error(
        fairy: Any, engine: AsyncEngine, exc: Exception, sql: str, params: Any
    ) -> Exception:
        """What SQLAlchemy would have raised for ``exc``: a driver error translated to its
        DBAPI class and wrapped in sqlalchemy.exc.DBAPIError; a dead link invalidated."""
        dialect: Any = engine.dialect
        try:
            fairy.dbapi_connection._handle_exception(exc)  # always raises, translated
        except Exception as translated:
            dbapi_exc = translated
        is_db = isinstance(dbapi_exc, dialect.loaded_dbapi.Error)
        dead = fairy.driver_connection.is_closed() or (
            is_db and dialect.is_disconnect(dbapi_exc, fairy.dbapi_connection, None))
        if dead:
            await greenlet_spawn(fairy.invalidate, dbapi_exc)
        if not is_db:
            return dbapi_exc  # not a database error: as it is
        wrapped: Exception = DBAPIError.instance(
            sql, params, dbapi_exc, dialect.loaded_dbapi.Error,
            connection_invalidated=dead, dialect=dialect)
        return wrapped

    def _bulk_statement(self, cols: JobColumns, wake: bool) -> tuple[str, tuple[Any, ...]]:
        varying = varying_fields(cols)  # one row: none (all scalars, a plain INSERT)
        sql = self._bulk_sql.get(varying)
        if sql is None:
            sql = self._bulk_sql[varying] = self._bulk_insert_sql(varying)
        params = (*(cols[name] if name in varying else cols[name][0] for name, _ in self._BULK),
                  wake, self.channel())
        return sql, params

    async def insert_jobs(self, conn: AsyncConnection, cols: JobColumns, wake: bool) -> list[int]:
        """One statement whatever the count: the fields that vary are bound as arrays and
        unnested, the ones equal on every row (most of them in a bulk load) as one value,
        so encoding is per array, not per row. Ids are drawn from the sequence in input
        order (WITH ORDINALITY, the CTE materialized so nextval runs once per row) and
        handed back as one array."""
        sql, params = self._bulk_statement(cols, wake)
        row = (await conn.exec_driver_sql(sql, params)).one()
        return list(row[0])

    async def insert_edges(
        self, conn: AsyncConnection, job_ids: list[int], up_ids: list[int]
    ) -> None:
        """All of a batch's edges in one statement: two arrays, unnested."""
        await conn.exec_driver_sql(
            f'INSERT INTO "{self.t.deps.name}" (job_id, depends_on_id) '
            "SELECT * FROM unnest($1::bigint[], $2::bigint[])", (job_ids, up_ids))

    @cached_property
    def _bulk_sql(self) -> dict[frozenset[str], str]:
        """The bulk INSERT by set of varying fields (a few shapes in practice; the driver
        prepares each once)."""
        return {}

    def _bulk_insert_sql(self, varying: frozenset[str]) -> str:
        table = f'"{self.t.jobs.name}"'  # quoted: a prefix may have capitals
        field: dict[str, str] = {}  # field -> SQL: a column of `input` or a parameter
        arrays, names = [], []
        for i, (name, typ) in enumerate(self._BULK, 1):
            if name in varying:
                arrays.append(f"${i}::{typ}[]")
                names.append(name)
                field[name] = name
            else:
                field[name] = f"${i}::{typ}"
        wake, channel = len(self._BULK) + 1, len(self._BULK) + 2
        f, now = field, "statement_timestamp()"
        columns = """type, kind, state, args, parent_id, group_key, weight, priority,
        pending, run_after, attempts, max_attempts, attempt_limit, timeout, key, live_key,
        cancelled_by, has_dependents, error, created_at, finished_at"""
        values = f"""{f["type"]}, {f["kind"]}, {f["state"]}, {f["args"]}::jsonb, {f["parent_id"]},
        {f["group_key"]}, {f["weight"]}, {f["priority"]}, {f["pending"]},
        COALESCE({f["run_at"]}, {now} + make_interval(secs => {f["delay"]})), 0,
        {f["max_attempts"]}, {f["max_attempts"]}, {f["timeout"]}, {f["key"]},
        CASE WHEN {f["dead"]} THEN NULL ELSE {f["key"]} END, {f["cancelled_by"]},
        {f["has_dependents"]}, {f["error"]}::jsonb, {now},
        CASE WHEN {f["dead"]} THEN {now} END"""
        notify = f"CASE WHEN ${wake}::bool THEN pg_notify(${channel}, '') END"
        if not varying:  # one row: a plain INSERT (less for the server to plan and run)
            return f"""
INSERT INTO {table} ({columns})
VALUES ({values})
RETURNING ARRAY[id], {notify}"""
        return f"""
WITH input AS MATERIALIZED (
    SELECT nextval((SELECT pg_get_serial_sequence('{table}', 'id'))) AS id, u.*
    FROM unnest({", ".join(arrays)}) WITH ORDINALITY AS u({", ".join(names)}, ord)
), ins AS (
    INSERT INTO {table} (id, {columns})
    SELECT id, {values}
    FROM input
)
SELECT array_agg(id ORDER BY ord), {notify}
FROM input"""


class _PgListener(Listener):
    """LISTEN on its own NullPool connection: never returned to a pool, never runs SQLAlchemy
    statements (a transaction left open there would hold back every notification).

    It connects to ``listen_url`` where given (a direct connection when ``engine`` goes
    through a transaction pooler), else to the engine's URL. Once listening it sends itself
    a NOTIFY through ``engine``; if that does not come back within PROBE_WAIT seconds (a
    transaction pooler passes LISTEN to some server connection and never forwards what it
    receives), it logs one warning and returns: the worker polls."""

    def __init__(self, engine: AsyncEngine, channel: str, listen_url: URL | None,
                 deaf: list[bool]) -> None:
        self._engine = engine
        self._url = listen_url or engine.url
        self._channel = channel
        self._deaf = deaf

    async def run(self, on_wake: WakeCallback) -> None:
        # its statements are the dialect's first-connect queries, LISTEN and SELECT 1: no
        # cache is worth keeping, and none may outlive its transaction behind a pooler
        engine = create_async_engine(self._url, poolclass=NullPool,
                                     connect_args=POOLED_CONNECT_ARGS)
        delay = 0.1
        try:
            while True:
                try:
                    if not await self._listen_once(engine, on_wake):
                        return
                    delay = 0.1
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # reconnect: polling covers the gap
                    log.warning("LISTEN connection lost (%s); reconnecting in %.1fs", exc, delay)
                    on_wake("")  # something may have happened while we were deaf
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
        finally:
            await engine.dispose()

    async def _probe(self, came: asyncio.Future[None], payload: str) -> bool:
        """Send ``payload`` on the channel through the queue's engine (the path every other
        worker's NOTIFY takes) and wait for it to come back."""
        async with self._engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(select(func.pg_notify(self._channel, payload)))
        try:
            async with asyncio.timeout(PROBE_WAIT):
                await asyncio.shield(came)
        except TimeoutError:
            return False
        return True

    async def _listen_once(self, engine: AsyncEngine, on_wake: WakeCallback) -> bool:
        """Listen until the connection is lost (raises); False if notifications do not
        arrive on it."""
        conn = await engine.connect()
        try:
            raw = await conn.get_raw_connection()
            apg: Any = raw.driver_connection
            loop = asyncio.get_running_loop()
            lost, came = loop.create_future(), loop.create_future()
            probe = f"ajq-probe:{uuid.uuid4().hex}"

            def _on_notify(_c: Any, _pid: int, _ch: str, payload: str) -> None:
                if payload == probe:
                    if not came.done():
                        came.set_result(None)
                else:
                    on_wake(payload)

            def _on_close(_c: Any) -> None:
                if not lost.done():
                    lost.set_result(None)

            await apg.add_listener(self._channel, _on_notify)
            apg.add_termination_listener(_on_close)
            on_wake("")
            try:
                if not await self._probe(came, probe):
                    if not self._deaf[0]:
                        self._deaf[0] = True
                        log.warning(
                            "notifications on %s do not arrive (its own NOTIFY did not come "
                            "back within %.0fs: a transaction pooler such as PgBouncer?); "
                            "workers poll every poll_interval instead. Give "
                            "JobQueue(listen_url=...) a direct connection to be woken at once",
                            self._url.render_as_string(hide_password=True), PROBE_WAIT)
                    return False
                while not lost.done():
                    # is_closed() alone misses a silently dead socket: probe it now and then.
                    try:  # asyncio.timeout: 3.11's wait_for can swallow a cancellation
                        async with asyncio.timeout(30.0):
                            await asyncio.shield(lost)
                    except TimeoutError:
                        await apg.execute("SELECT 1")
                raise ConnectionError("listener connection closed")
            finally:
                if not apg.is_closed():
                    await apg.remove_listener(self._channel, _on_notify)
        finally:
            await conn.close()

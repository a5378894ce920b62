"""Where PostgreSQL's time goes in a drain, in counters that do not drift with load: two
trees alternated, each drain in a fresh process importing ``aiojobqueue`` from its tree.

    PYTHONPATH=$PWD /work/venv/bin/python bench/pg_dag_stats.py --trees /tmp/ajq-old,$PWD \\
        [--shape dag|flat] [--n 10000] [--conc 50] [--reps 3] [--sql DIR]

Per drain (a fresh table prefix, bench/obs_ab.py's jobs, ``ANALYZE``, then a second
queue whose engine is opened after the build, so its sessions count the drain alone):

* the CPU of the drain's own server backends (``/proc/PID/stat`` of each pooled session,
  read before the queue closes: other sessions on the shared server do not count);
* the tables' counters (``pg_stat_user_tables``, ``pg_statio_user_tables``, per index
  ``pg_stat_user_indexes``): row updates and HOT ones, index scans and the entries they
  read, buffers hit, read by the queue's sessions closed before reading (a closing backend
  flushes its statistics);
* the routines' calls and time (``track_functions = 'pl'`` set in each drain session);
* statements sent per job, by statement (a cursor hook: an executemany counts one).

A tree given as ``DIR:TWEAK`` (several joined by ``+``) changes its drains: ``drop``
drops schema v7's partial indexes first, ``cols`` adds issue 20's three columns (to a
tree without them), ``generic`` / ``custom`` set ``plan_cache_mode`` to
``force_generic_plan`` / ``force_custom_plan`` in the drain's sessions, ``explain`` logs
every plan, the routines' statements too, with row counts (auto_explain, loaded per
session) to the server's log. ``--sql DIR`` writes each tree's routine definitions and the
statements it sent there, for a diff. Needs a server on this machine (``AIOJOBQUEUE_TEST_PG``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

URL = os.environ.get("AIOJOBQUEUE_TEST_PG", "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
HERE = os.path.dirname(os.path.abspath(__file__))
TICK = os.sysconf("SC_CLK_TCK")

TABLES = """
SELECT s.relname, s.n_tup_upd, s.n_tup_hot_upd, s.n_tup_ins, s.n_tup_del, s.idx_scan,
       s.idx_tup_fetch, s.seq_scan, s.seq_tup_read, io.heap_blks_hit, io.idx_blks_hit
  FROM pg_stat_user_tables s JOIN pg_statio_user_tables io USING (relid)
 WHERE s.relname LIKE :p
"""
INDEXES = """
SELECT indexrelname, idx_scan, idx_tup_read FROM pg_stat_user_indexes WHERE relname LIKE :p
"""
FUNCS = """
SELECT funcname, calls, total_time, self_time FROM pg_stat_user_functions
 WHERE funcname LIKE :p
"""


def cpu_of(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICK


async def snapshot(engine: Any, p: str) -> dict[str, float]:
    """Every counter of the prefix's tables, indexes and routines, flat."""
    from sqlalchemy import text

    out: dict[str, float] = {}
    async with engine.connect() as conn:
        await conn.execute(text("SELECT pg_stat_clear_snapshot()"))
        pat = {"p": p.replace("_", "\\_") + "%"}
        for row in (await conn.execute(text(TABLES), pat)).mappings():
            name = row["relname"][len(p):]
            for k, v in row.items():
                if k != "relname":
                    out[f"{name}.{k}"] = float(v or 0)
        for row in (await conn.execute(text(INDEXES), pat)).mappings():
            name = row["indexrelname"][len(p):]
            out[f"ix {name}.scan"] = float(row["idx_scan"] or 0)
            out[f"ix {name}.read"] = float(row["idx_tup_read"] or 0)
        for row in (await conn.execute(text(FUNCS), pat)).mappings():
            kind = row["funcname"].rsplit("_", 1)[-1]
            kind = kind if kind in ("rel", "rest") else "settle"
            out[f"fn {kind}.calls"] = float(row["calls"])
            out[f"fn {kind}.total_ms"] = float(row["total_time"])
            out[f"fn {kind}.self_ms"] = float(row["self_time"])
    return out


async def child(shape: str, n: int, conc: int, sql_dir: str | None, tag: str,
                tweak: str) -> dict[str, Any]:
    from sqlalchemy import event, text
    from sqlalchemy.ext.asyncio import create_async_engine
    from sqlalchemy.pool import Pool

    from aiojobqueue import JobQueue

    spec = importlib.util.spec_from_file_location("obs_ab", os.path.join(HERE, "obs_ab.py"))
    assert spec is not None and spec.loader is not None
    obs: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(obs)
    p = f"st{uuid.uuid4().hex[:6]}_"
    side = create_async_engine(URL)
    q = JobQueue(URL, prefix=p, capacity=conc)

    @q.handler("noop")
    async def noop(ctx: Any) -> None:
        pass

    try:
        async with q:
            async with q.engine.begin() as conn:
                for what in tweak.split("+") if tweak else ():
                    if what == "drop":  # schema v7's partial indexes
                        for st in ("waiting", "scheduled", "failed"):
                            await conn.execute(text(f"DROP INDEX IF EXISTS {p}ix_{st}_group"))
                    elif what in ("generic", "custom", "explain"):  # set per session
                        pass
                    elif what == "cols":  # issue 20's columns, on a tree without them
                        await conn.execute(text(
                            f"ALTER TABLE {p}jobs ADD COLUMN IF NOT EXISTS progress jsonb, "
                            "ADD COLUMN IF NOT EXISTS errors jsonb, "
                            "ADD COLUMN IF NOT EXISTS trace jsonb"))
                    else:
                        raise SystemExit(f"unknown tweak {what}")
            total = await obs.build(q, n, shape == "dag")
            async with q.engine.begin() as conn:
                await conn.execute(text(f"ANALYZE {p}jobs"))
                await conn.execute(text(f"ANALYZE {p}deps"))
        await asyncio.sleep(1.0)  # the build's sessions have closed and flushed
        before = await snapshot(side, p)

        pids: list[int] = []

        def on_connect(dbapi_conn: Any, _rec: Any) -> None:
            # every session of the drain (the pool's and the listener's)
            # on the driver's link: a SET in the adapter's implicit transaction would be
            # rolled back when the pool resets the connection
            async def setup(apg: Any) -> None:
                await apg.execute("SET track_functions = 'pl'")
                if "explain" in tweak.split("+"):  # every plan, nested ones too, to the log
                    for sql in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                                "SET auto_explain.log_nested_statements = on",
                                "SET auto_explain.log_analyze = on",
                                "SET auto_explain.log_timing = off"):
                        await apg.execute(sql)
                for mode in ("generic", "custom"):
                    if mode in tweak.split("+"):
                        await apg.execute(f"SET plan_cache_mode = force_{mode}_plan")
                pids.append(int(await apg.fetchval("SELECT pg_backend_pid()")))

            dbapi_conn.run_async(setup)

        event.listen(Pool, "connect", on_connect)
        sent: collections.Counter[str] = collections.Counter()
        q2 = JobQueue(URL, prefix=p, capacity=conc)
        q2.handler("noop")(noop)
        async with q2:
            def count(_c: Any, _cur: Any, statement: str, *_a: Any) -> None:
                sent[" ".join(statement.split())] += 1

            event.listen(q2.engine.sync_engine, "before_cursor_execute", count)
            cpu0: dict[int, float] = {}
            for pid in pids:
                with contextlib.suppress(OSError):  # a start-up session already closed
                    cpu0[pid] = cpu_of(pid)
            opened = len(pids)
            t0 = time.monotonic()
            await q2.run_until_idle()
            t1 = time.monotonic()
            event.remove(q2.engine.sync_engine, "before_cursor_execute", count)
            cpu = 0.0
            for pid in pids:
                with contextlib.suppress(OSError):
                    cpu += cpu_of(pid) - cpu0.get(pid, 0.0)
            if sql_dir:
                async with q2.engine.connect() as conn:
                    defs = (await conn.execute(text(
                        "SELECT proname, pg_get_functiondef(oid) FROM pg_proc "
                        "WHERE proname LIKE :p ORDER BY 1"), {"p": p + "%"})).all()
                os.makedirs(sql_dir, exist_ok=True)
                with open(os.path.join(sql_dir, f"{tag}.routines.sql"), "w") as f:  # noqa: ASYNC230
                    for name, body in defs:
                        f.write(body.replace(p, "ajq_").replace(name[len(p):], "ajq_" +
                                name[len(p):].split("_settle_")[0] + "_settle_X") + "\n\n")
                with open(os.path.join(sql_dir, f"{tag}.statements.txt"), "w") as f:  # noqa: ASYNC230
                    for s, k in sent.most_common():
                        f.write(f"{k}\t{s.replace(p, 'ajq_')}\n")
        event.remove(Pool, "connect", on_connect)
        await asyncio.sleep(1.0)
        after = await snapshot(side, p)
    finally:
        async with side.begin() as conn:
            await conn.run_sync(q._t.metadata.drop_all)
        await side.dispose()
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    delta["backend cpu us"] = cpu * 1e6
    delta["statements"] = float(sum(sent.values()))
    delta["sessions opened in the drain"] = float(len(pids) - opened)
    delta["sessions"] = float(len(pids))
    delta["drain start"], delta["drain end"] = t0 * total, t1 * total  # (per job: / total)
    return {"n": total, "delta": delta}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trees", default=os.path.dirname(HERE))
    ap.add_argument("--shape", default="dag", choices=("flat", "dag"))
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--conc", type=int, default=50)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sql", help="write each tree's routines and statements here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tag", default="", help=argparse.SUPPRESS)
    ap.add_argument("--tweak", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(asyncio.run(child(a.shape, a.n, a.conc, a.sql, a.tag, a.tweak))))
        return
    trees = a.trees.split(",")
    got: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
    for r in range(a.reps):
        for tree in trees[r % len(trees):] + trees[:r % len(trees)]:
            tag = f"tree{trees.index(tree)}"
            path, _, tweak = tree.partition(":")
            cmd = [sys.executable, __file__, "--child", "--shape", a.shape, "--n", str(a.n),
                   "--conc", str(a.conc), "--tag", tag, "--tweak", tweak]
            cmd += ["--sql", a.sql] if a.sql else []
            out = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": path},
                                 capture_output=True, text=True, timeout=900)
            if out.returncode:
                raise SystemExit(out.stderr[-3000:])
            res = json.loads(out.stdout.strip().splitlines()[-1])
            per = {key: v / res["n"] for key, v in res["delta"].items()}
            got[tree].append(per)
            d = res["delta"]
            print(f"round {r + 1} {tree}: {d['sessions']:.0f} sessions "
                  f"({d['sessions opened in the drain']:.0f} in the drain), "
                  f"backend {per['backend cpu us']:.1f} us/job, "
                  f"routines {per.get('fn settle.self_ms', 0) * 1e3:.1f} + "
                  f"{per.get('fn rest.self_ms', 0) * 1e3:.1f} us/job, "
                  f"{per['statements']:.3f} statements/job (load {os.getloadavg()[0]:.1f})",
                  flush=True)
    keys = sorted({k for rows in got.values() for row in rows for k in row})
    print(f"\n{a.shape} drain, {a.n} jobs, C={a.conc}, {a.reps} rounds: medians per job")
    print("| counter | " + " | ".join(trees) + " | ratio |\n|---|" + "---:|" * (len(trees) + 1))
    for key in keys:
        meds = [statistics.median(row.get(key, 0.0) for row in got[t]) for t in trees]
        if not any(meds):
            continue
        ratio = f"{meds[-1] / meds[0]:.2f}" if meds[0] else "-"
        print(f"| {key} | " + " | ".join(f"{m:.3f}" for m in meds) + f" | {ratio} |")


if __name__ == "__main__":
    main()

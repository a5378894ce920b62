"""aiojobqueue's own benchmark scenarios, one command, one table.

    /tmp/peers-venv/bin/python bench/run.py [--n 20000]
        [--only pg,dag,large,latency,enqueue,sqlite,mariadb]

Run it with the shared peer harness's venv (/tmp/peers-venv: pgqueuer is installed there, and
aiojobqueue with ``pip install -e .[postgresql,mysql]``). Every figure in one row group is
measured in the same run, back to back, so ratios come from one noise window.

* ``enqueue``: batches of 10,000 jobs (after a warm-up call, the median of 3), and 1,000
  single ``enqueue()`` calls, aiojobqueue against pgqueuer (``Queries.enqueue`` with lists /
  one job per call), each side in the same way.
* ``pg``: flat drain of N no-op jobs by one worker (``run_until_idle``, capacity C) at C=10 and
  C=50, against pgqueuer (C-mapped: batch C/2, cap C; and its defaults), same process model.
* ``dag``: the same N jobs as a DAG: L layers, each a container holding a head job, a
  fan-out of W jobs depending on the head and a fan-in job depending on all W; each layer's
  container depends on the previous one (one chain: every layer boundary is on the critical
  path), then the same containers as 4 independent chains. Rate against the flat rate at
  the same C measured just before it; ``--reps`` such pairs, the median ratio reported; and
  the CPU per job of the flat and one-chain drains, in this process and in every process of
  the PostgreSQL server (read from /proc when the server is local).
* ``large``: 1,000,000 finished jobs and 100,000 jobs waiting on a dependency in the table,
  then the flat drain of N more, alternated ``--reps`` times with an empty-table flat drain
  at C=50: the median of the per-pair ratios; and the claim's generic plan (PREPARE +
  plan_cache_mode=force_generic_plan) must stay on the ready index.
* ``latency``: an idle ``serve()`` worker (capacity 10), 200 single enqueues 20 ms apart:
  enqueue call start -> handler start, against pgqueuer.
* ``sqlite`` / ``mariadb``: flat drain at C=10/50 and latency, against the raw claim+finalize
  ceilings of /work/shared/bench-sqlite-mariadb (raw_sqlite.py / raw_mariadb.py, 1 trial).

Settings are the defaults a user gets (poll_interval=1, lease_ttl=30, heartbeat 10 s, fenced
finalize), with ``capacity=C``. Databases: PostgreSQL ``bench`` role (created by the shared
harness's run.sh), MariaDB root@127.0.0.1, SQLite files under /tmp/ajq-bench.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
PEERS = "/work/shared/bench-peers"
SMDB = "/work/shared/bench-sqlite-mariadb"
sys.path[:0] = [HERE, PEERS]

import peer_aiojobqueue as A  # noqa: E402
from common import ADMIN_DSN, Recorder, fresh_db, pct  # noqa: E402

ROWS: list[tuple[str, str, str, str]] = []  # (scenario, what, value, note)
# The scratch database (dropped and re-created per phase): give concurrent runs on one
# server their own, e.g. AJQ_BENCH_DB=bench_ajq_dag (two runs on one name break each other).
DB = os.environ.get("AJQ_BENCH_DB", "bench_ajq")


def row(scenario: str, what: str, value: str, note: str = "") -> None:
    ROWS.append((scenario, what, value, note))
    print(f"  {scenario:10s} {what:48s} {value:>14s}  {note}", flush=True)


def rate(x: float) -> str:
    return f"{x:,.0f}/s"


# -- helpers ----------------------------------------------------------------------------------
#: CPU seconds of each drain made with a label: (this process, the PostgreSQL server or None,
#: jobs completed)
CPU: dict[str, list[tuple[float, float | None, int]]] = {}


async def drain_aiojobqueue(where: Any, conc: int,
                            cpu: str | None = None) -> tuple[float, dict[str, Any]]:
    """Drain by one worker at capacity ``conc``; with ``cpu``, the CPU time the drain took in
    this process and in the database server is noted under that label (see cpu_note)."""
    rec = Recorder()
    before = await _cpu(where) if cpu else None
    await A._work(where, conc, True, rec, asyncio.Event())
    after = await _cpu(where) if cpu else None
    v = await A._verify(where, 0)
    if cpu and before and after:
        pg = None if after[1] is None or before[1] is None else after[1] - before[1]
        CPU.setdefault(cpu, []).append((after[0] - before[0], pg, v["completed"]))
    return v["t_last_done"] - rec.first_start, v | {"dups": rec.dups, "handled": len(rec.seen)}


def cpu_note(label: str) -> str:
    """Median CPU per job of the drains noted under ``label``: "py X / pg Y us"."""
    import statistics

    got = CPU.get(label, [])
    if not got:
        return ""
    py = statistics.median(p / n * 1e6 for p, _, n in got if n)
    pgs = [g / n * 1e6 for _, g, n in got if n and g is not None]
    return f"py {py:.0f} / pg {statistics.median(pgs):.0f} us/job" if pgs else f"py {py:.0f} us/job"


async def _cpu(where: Any) -> tuple[float, float | None]:
    """(CPU seconds of this process, of the local PostgreSQL server's processes or None where
    they cannot be read: a remote server, no /proc)."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    pm = await _postmaster(where) if isinstance(where, str) else None
    return ru.ru_utime + ru.ru_stime, None if pm is None else _server_cpu(pm)


def _server_cpu(pm: str) -> float:
    """The postmaster's own CPU time, its reaped children's (closed connections) and its
    live children's, in seconds."""
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # state ppid ... utime stime cutime cstime
        if pid == pm:
            total += sum(int(x) for x in fields[11:15])
        elif fields[1] == pm:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


_PM: list[str | None] = []


async def _postmaster(dsn: str) -> str | None:
    """The local postmaster's pid (its postmaster.pid; the bench role is a superuser)."""
    if not _PM:
        import asyncpg

        pid = None
        try:
            conn = await asyncpg.connect(dsn.replace("postgresql+asyncpg", "postgresql"))
            try:
                pid = str(await conn.fetchval("SELECT pg_read_file('postmaster.pid')")).split()[0]
            finally:
                await conn.close()
        except Exception:  # not readable (not a superuser, say): no server CPU figures
            pid = None
        # a remote server's pid means nothing here; once per run, so the blocking look is fine
        _PM.append(pid if pid and os.path.exists(f"/proc/{pid}/stat") else None)  # noqa: ASYNC240
    return _PM[0]


async def drain_pgqueuer(dsn: str, conc: int, defaults: bool) -> float:
    import peer_pgqueuer as P

    rec = Recorder()
    params = {"batch_size": 10, "max_concurrent_tasks": None} if defaults else None
    await P.work(dsn, conc, True, rec, asyncio.Event(), params=params)
    v = await P.verify(dsn, 0)
    return float(v["t_last_done"] - rec.first_start)


def check(v: dict[str, Any], n: int) -> str:
    ok = (v["completed"] == n and v["distinct"] == n and v["remaining"] == 0
          and v["starts"] == n and v["dups"] == 0)
    return "ok" if ok else f"VERIFY FAILED {v}"


# -- scenarios --------------------------------------------------------------------------------
async def sc_enqueue(args: argparse.Namespace) -> None:
    import statistics

    import peer_pgqueuer as P

    # Each side: one warm-up call (connection, prepared statements, our group row), then
    # REPS batches of 10,000, the median rate reported (one cold batch was a noisy figure).
    n_batch, n_single, reps = 10_000, 1_000, 3
    dsn = await fresh_db(DB)
    await A._install(dsn)
    async with A._queue(dsn) as q:
        await q.enqueue(A.TYPE, {"ts": -1.0})
        rates = []
        for _ in range(reps):
            t0 = time.perf_counter()
            async with q.batch() as b:
                for _ in range(n_batch):
                    b.add(A.TYPE, {"ts": 0.0})
            rates.append(n_batch / (time.perf_counter() - t0))
        a_batch = statistics.median(rates)
        t0 = time.perf_counter()
        for _ in range(n_single):
            await q.enqueue(A.TYPE, {"ts": 0.0})
        a_single = n_single / (time.perf_counter() - t0)
    dsn = await fresh_db("bench_pgq")
    await P.install(dsn)
    import asyncpg
    from pgqueuer import Queries
    from pgqueuer.db import AsyncpgDriver

    conn = await asyncpg.connect(dsn)
    try:
        qq = Queries(AsyncpgDriver(conn))
        await qq.enqueue(P.EP, None)
        rates = []
        for _ in range(reps):
            t0 = time.perf_counter()
            await qq.enqueue([P.EP] * n_batch, [None] * n_batch, [0] * n_batch)
            rates.append(n_batch / (time.perf_counter() - t0))
        p_batch = statistics.median(rates)
        t0 = time.perf_counter()
        for _ in range(n_single):
            await qq.enqueue(P.EP, None)
        p_single = n_single / (time.perf_counter() - t0)
    finally:
        await conn.close()
    row("enqueue", f"batch of 10,000 (median of {reps}, warm): aiojobqueue / pgqueuer",
        rate(a_batch),
        f"pgqueuer {rate(p_batch)}  ratio {a_batch / p_batch:.2f}")
    row("enqueue", "1,000 x enqueue(): aiojobqueue / pgqueuer", rate(a_single),
        f"pgqueuer {rate(p_single)}  ratio {a_single / p_single:.2f}")


async def flat(conc: int, n: int, cpu: str | None = None) -> tuple[float, str]:
    dsn = await fresh_db(DB)
    await A._install(dsn)
    await A._enqueue_batch(dsn, n, 1000)
    span, v = await drain_aiojobqueue(dsn, conc, cpu)
    return n / span, check(v, n)


async def sc_pg(args: argparse.Namespace) -> dict[int, float]:
    import peer_pgqueuer as P

    out: dict[int, float] = {}
    for conc in (10, 50):
        r, ok = await flat(conc, args.n)
        out[conc] = r
        dsn = await fresh_db("bench_pgq")
        await P.install(dsn)
        await P.enqueue_batch(dsn, args.n, 1000)
        pm = args.n / await drain_pgqueuer(dsn, conc, False)
        dsn = await fresh_db("bench_pgq")
        await P.install(dsn)
        await P.enqueue_batch(dsn, args.n, 1000)
        pd = args.n / await drain_pgqueuer(dsn, conc, True)
        best = max(pm, pd)
        row("pg", f"flat drain C={conc}, N={args.n}", rate(r),
            f"pgqueuer C-mapped {rate(pm)}, defaults {rate(pd)}; vs best {r / best:.2f}  {ok}")
    return out


async def build_dag(q: Any, n: int, layers: int, chains: int = 1) -> int:
    """``layers`` containers of n / layers jobs (a head, a fan-out on it, a fan-in tail),
    in ``chains`` independent chains (each container depends on the one before it)."""
    width = max(n // layers - 2, 1)
    total = 0
    prev: list[Any] = [None] * chains
    for i in range(layers):
        c = i % chains
        async with q.batch() as b:
            box = b.container("layer", depends_on=[prev[c]] if prev[c] is not None else [])
            head = b.add(A.TYPE, {"ts": 0.0}, parent=box)
            fan = [b.add(A.TYPE, {"ts": 0.0}, parent=box, depends_on=[head]) for _ in range(width)]
            b.add(A.TYPE, {"ts": 0.0}, parent=box, depends_on=fan)
        prev[c] = box.id
        total += width + 2
    return total


async def loaded(db: str, n: int, dag: bool) -> tuple[str, int]:
    """A fresh database ``db`` with the queue installed and ``n`` no-op jobs waiting,
    independent or as build_dag's 20 layers; returns its DSN and the number of jobs."""
    dsn = await fresh_db(db)
    await A._install(dsn)
    if not dag:
        await A._enqueue_batch(dsn, n, 1000)
        return dsn, n
    async with A._queue(dsn) as q:
        return dsn, await build_dag(q, n, 20)


async def sc_dag(args: argparse.Namespace, flat_rates: dict[int, float]) -> None:
    """Flat and DAG drains alternated ``--reps`` times per C (this machine's rate moves by
    up to 2x between minutes): each DAG rate against the flat rate measured just before it,
    the median of those ratios reported; and the CPU each drain took per job, in this process
    and in the (local) PostgreSQL server."""
    import statistics

    for conc in (10, 50):
        ratios: dict[int, list[float]] = {1: [], 4: []}
        rates: dict[int, list[float]] = {1: [], 4: []}
        flats: list[float] = []
        ok = "ok"
        n = args.n
        for _rep in range(args.reps):
            flat_rates[conc] = (await flat(conc, args.n, cpu=f"flat C={conc}"))[0]
            flats.append(flat_rates[conc])
            for chains in (1, 4):
                dsn = await fresh_db(DB)
                await A._install(dsn)
                async with A._queue(dsn) as q:
                    n = await build_dag(q, args.n, args.layers, chains)
                span, v = await drain_aiojobqueue(dsn, conc, cpu=f"dag{chains} C={conc}")
                for k in ("completed", "distinct"):  # the containers are done too, never run
                    v[k] -= args.layers
                if check(v, n) != "ok":
                    ok = check(v, n)
                rates[chains].append(n / span)
                ratios[chains].append(n / span / flat_rates[conc])
        for chains in (1, 4):
            shape = (f"{args.layers} layers x {n // args.layers} jobs" if chains == 1 else
                     f"the same as {chains} chains of {args.layers // chains}")
            each = " ".join(f"{x:.2f}" for x in ratios[chains])
            row("dag", f"DAG drain C={conc}: {shape}", rate(statistics.median(rates[chains])),
                f"vs flat {rate(statistics.median(flats))}: median ratio "
                f"{statistics.median(ratios[chains]):.2f} ({each})  {ok}")
        row("dag", f"CPU per job C={conc}: flat / DAG one chain",
            cpu_note(f"flat C={conc}") or "n/a",
            f"DAG {cpu_note(f'dag1 C={conc}') or 'n/a'} (medians; pg: every process of the "
            "local server, n/a when it cannot be read)")


LARGE_SQL = """
INSERT INTO ajq_jobs (type, kind, state, args, group_key, weight, priority, pending, run_after,
  attempts, max_attempts, attempt_limit, created_at, finished_at, result)
SELECT 'noop', 'job', 'done', '{{}}'::jsonb, 'default', 1, 0, 0, now(), 1, 3, 3, now(), now(),
  'null'::jsonb FROM generate_series(1, {done});
INSERT INTO ajq_jobs (type, kind, state, args, group_key, weight, priority, pending, run_after,
  attempts, max_attempts, attempt_limit, created_at)
VALUES ('blocker', 'job', 'waiting', '{{}}'::jsonb, 'default', 1, 0, 1, now(), 0, 3, 3, now());
INSERT INTO ajq_jobs (type, kind, state, args, group_key, weight, priority, pending, run_after,
  attempts, max_attempts, attempt_limit, created_at)
SELECT 'noop', 'job', 'waiting', '{{}}'::jsonb, 'default', 1, 0, 1, now(), 0, 3, 3, now()
  FROM generate_series(1, {waiting});
INSERT INTO ajq_deps (job_id, depends_on_id)
SELECT id, (SELECT id FROM ajq_jobs WHERE type = 'blocker') FROM ajq_jobs
 WHERE state = 'waiting' AND type = 'noop';
"""


async def generic_plan(dsn: str) -> str:
    """The claim's pick-and-lease statement under a forced generic plan (dialect-facts 18)."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
            await conn.execute(
                "PREPARE pick(text, int) AS SELECT id FROM ajq_jobs WHERE state = 'ready' "
                "AND group_key = $1 AND type IN ('noop') ORDER BY priority DESC, id LIMIT $2 "
                "FOR UPDATE SKIP LOCKED")
            plan = [r[0] for r in await conn.fetch("EXPLAIN EXECUTE pick('default', 100)")]
            await conn.execute("DEALLOCATE pick")
        return " / ".join(p.strip() for p in plan)
    finally:
        await conn.close()


async def sc_large(args: argparse.Namespace, flat_rates: dict[int, float]) -> None:
    """The flat drain next to a large history, against the empty-table drain: ``--reps``
    pairs alternated (an empty-table drain, then the same N jobs enqueued into the large
    database and drained), the median of the per-pair ratios reported (this machine's rate
    moves by up to 2x between minutes); then the claim's generic plan."""
    import statistics

    import asyncpg

    conc = 50
    dsn = await fresh_db(DB + "_large")
    await A._install(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        t0 = time.perf_counter()
        await conn.execute(LARGE_SQL.format(done=args.large_done, waiting=args.large_waiting))
        await conn.execute("VACUUM ANALYZE ajq_jobs")
        await conn.execute("VACUUM ANALYZE ajq_deps")
        fill_s = time.perf_counter() - t0
    finally:
        await conn.close()
    n = args.n
    ratios: list[float] = []
    rates: list[float] = []
    ok = "ok"
    for rep in range(args.reps):
        base = (await flat(conc, n))[0]
        flat_rates[conc] = base
        await A._enqueue_batch(dsn, n, 1000)
        span, v = await drain_aiojobqueue(dsn, conc)
        done_before = args.large_done + rep * n  # earlier reps' jobs are done history too
        for k in ("completed", "distinct", "starts"):
            v[k] -= done_before
        v["remaining"] -= args.large_waiting + 1
        if check(v, n) != "ok":
            ok = check(v, n)
        rates.append(n / span)
        ratios.append(n / span / base)
    plan = await generic_plan(dsn)
    uses = "ix_ready" in plan
    each = " ".join(f"{x:.2f}" for x in ratios)
    row("large", f"drain C={conc} with {args.large_done:,} done + {args.large_waiting:,} waiting",
        rate(statistics.median(rates)),
        f"vs empty table: median ratio {statistics.median(ratios):.2f} ({each})  {ok} "
        f"(fill {fill_s:.0f}s)")
    row("large", "claim pick, forced generic plan", "ix_ready" if uses else "NOT ix_ready",
        plan[:160])


async def sc_latency(args: argparse.Namespace) -> None:
    import peer_pgqueuer as P

    for name, mod in (("aiojobqueue", A), ("pgqueuer", P)):
        dsn = await fresh_db(f"bench_{name[:3]}")
        await mod.install(dsn)
        lat = await latency_run(dsn, mod)
        row("latency", f"PG wake latency p50 / p99 ({name})",
            f"{pct(lat, 50):.1f} / {pct(lat, 99):.1f} ms", f"n={len(lat)}")


async def latency_run(dsn: str, mod: Any, jobs: int = 200, gap: float = 0.02) -> list[float]:
    """The harness's latency phase, but the worker in a subprocess of its worker_main.py."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "lat.json")
        env = dict(os.environ, PEER_PATH=HERE)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, os.path.join(PEERS, "worker_main.py"), mod.NAME, dsn, "10", "listen",
            str(5 + jobs), out, stdout=asyncio.subprocess.PIPE, cwd=PEERS, env=env)
        assert proc.stdout is not None
        await proc.stdout.readline()
        await asyncio.sleep(2.0)
        prod = mod.Producer()
        await prod.open(dsn)
        try:
            for _ in range(5):
                await prod.enqueue_one(warmup=True)
                await asyncio.sleep(0.2)
            for _ in range(jobs):
                await prod.enqueue_one()
                await asyncio.sleep(gap)
            await asyncio.wait_for(proc.wait(), 60)
        finally:
            await prod.close()
        with open(out) as f:  # noqa: ASYNC230 - a small file, after the run
            return [x * 1000 for x in json.load(f)["latencies"]]


def raw_ceiling(script: str, scale: float) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "raw.jsonl")
        subprocess.run([sys.executable, os.path.join(SMDB, script), "--trials", "1",
                        "--scale", str(scale), "--out", out], check=True, cwd=SMDB,
                       capture_output=True)
        with open(out) as f:
            return [json.loads(x) for x in f]


def smdb_latency(target: dict[str, Any]) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "lat.json")
        env = dict(os.environ, PEER_PATH=HERE)
        p = subprocess.Popen([sys.executable, os.path.join(SMDB, "worker_main.py"), A.NAME,
                              json.dumps(target), "10", "listen", "205", "0", out],
                             cwd=SMDB, stdout=subprocess.PIPE, env=env)
        assert p.stdout is not None
        p.stdout.readline()
        time.sleep(2.0)
        A.produce(target, 5, 200, 0.02)
        p.wait(timeout=120)
        with open(out) as f:
            return [x * 1000 for x in json.load(f)["latencies"]]


def sc_other(db: str, args: argparse.Namespace) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("smdb_common", os.path.join(SMDB, "common.py"))
    assert spec is not None and spec.loader is not None
    smdb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smdb)
    fresh_target = smdb.fresh_target

    raw = raw_ceiling("raw_sqlite.py" if db == "sqlite" else "raw_mariadb.py", args.raw_scale)
    for conc in (10, 50):
        target = fresh_target("ajq", db)
        A.install(target)
        A.enqueue_batch(target, args.n_other, 1000)
        span, v = asyncio.run(drain_aiojobqueue(target, conc))
        r = args.n_other / span
        ceil = [x for x in raw if x.get("clients") == 1 and x.get("sync", "FULL") == "FULL"]
        notes = ", ".join(f"{x['test']} {rate(x['jobs_per_s'])} ({r / x['jobs_per_s']:.2f})"
                          for x in ceil)
        row(db, f"flat drain C={conc}, N={args.n_other}", rate(r),
            f"raw 1-client ceilings: {notes}  {check(v, args.n_other)}")
    lat = smdb_latency(fresh_target("ajq", db))
    row(db, "wake latency p50 / p99 (SQLite: data_version watch; MariaDB: polling)",
        f"{pct(lat, 50):.1f} / {pct(lat, 99):.1f} ms", f"n={len(lat)}")


async def amain(args: argparse.Namespace) -> None:
    only = set(args.only.split(","))
    flat_rates: dict[int, float] = {}
    if "enqueue" in only:
        await sc_enqueue(args)
    if "pg" in only:
        flat_rates = await sc_pg(args)
    if "dag" in only:
        await sc_dag(args, flat_rates)
    if "large" in only:
        await sc_large(args, flat_rates)
    if "latency" in only:
        await sc_latency(args)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--n-other", type=int, default=20000, help="N on SQLite / MariaDB")
    ap.add_argument("--layers", type=int, default=20)
    ap.add_argument("--reps", type=int, default=3,
                    help="flat/DAG pairs per C (dag), empty/large pairs (large)")
    ap.add_argument("--large-done", type=int, default=1_000_000)
    ap.add_argument("--large-waiting", type=int, default=100_000)
    ap.add_argument("--raw-scale", type=float, default=0.5)
    ap.add_argument("--only", default="enqueue,pg,dag,large,latency,sqlite,mariadb")
    args = ap.parse_args()
    os.environ.setdefault("SMDB_DATA", "/tmp/ajq-bench")
    print(f"# aiojobqueue bench {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}  "
          f"N={args.n}  PG={ADMIN_DSN}", flush=True)
    asyncio.run(amain(args))
    for db in ("sqlite", "mariadb"):
        if db in args.only.split(","):
            sc_other(db, args)
    print("\n| scenario | what | aiojobqueue | comparison |\n|---|---|---|---|")
    for r in ROWS:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()

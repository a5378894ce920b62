"""How promptly an idle worker starts a job on each database, what its idleness costs, and
how fast one worker with ``capacity=1`` drains, against the raw ceiling of the same run.

    PYTHONPATH=$PWD /work/venv/bin/python bench/wake.py [--dbs sqlite,mariadb,postgresql]

Per database, one table row:

* **wake p50 / p99**: enqueue -> handler start, the enqueue in another process (its own
  interpreter and connections), the worker idle in this one with the default settings
  (``poll_interval=1``). *warm*: 20 ms apart, as the shared harness sends them (the MySQL
  bell watch then looks every 10 ms); *cold*: 1.3 s apart (past its warm second: the
  watch holding the queue's baton sleeps on the server until a ringer's KILL QUERY, what a
  long-idle worker does). *from
  another host*: the cold enqueues from a network namespace of its own on a bridge, reaching
  the server over that link through a forwarder process (tests/netkit.py; needs root and
  ``ip``, else —).
* **next start**: completion -> next start across processes: a job finishes in another
  process (its worker idle in between), its finalize releases a dependent, and the idle
  worker here (which serves only the dependent) starts it; 1.3 s apart.
* **idle q/s**: the statements one idle worker sends the server per second (its pool and its
  wake-up's own connection), counted by the client over a quiet window, at about 1,000 and
  1,000,000 rows in the jobs table, and the median time of one bell look at each (MySQL).
* **C=1**: ``run_until_idle()`` of N no-op jobs with ``capacity=1`` against the raw
  claim1 + finalize1 loop of ``/work/shared/bench-sqlite-mariadb`` (SQLite at
  ``synchronous=FULL``, as aiojobqueue runs it; MariaDB one client), alternated.
* **bell cost** (MariaDB): single ``enqueue()`` calls per second with the bell rung and with
  it silenced, alternated (one bell UPDATE per enqueue transaction, no worker); and, with an
  idle worker in another process, the median time of one ``enqueue()`` 0.6 s apart, rung vs
  silenced.
* **fleet** (MariaDB): the statements per second one bell watch sends when 1 and when 16
  watches of one queue are idle (the watches alone).

``--parts`` runs only some columns (``wake,host,next,idle,c1,bell,fleet``): an A/B of two
trees runs this file under each tree's PYTHONPATH in turn (the producers import the same tree).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

import aiojobqueue
from aiojobqueue import JobQueue
from aiojobqueue.schema import build_tables

HARNESS = "/work/shared/bench-sqlite-mariadb"
URLS = {
    "sqlite": None,  # a temp file per run
    "mariadb": "mysql+aiomysql://root@127.0.0.1:3306/test",
    "postgresql": "postgresql+asyncpg://postgres@127.0.0.1:5432/test",
}
#: the tree whose aiojobqueue this run imports (PYTHONPATH): its producers run the same code
#: (started there: ``python -c`` puts its working directory first on sys.path)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(aiojobqueue.__file__)))
#: tests/netkit.py: hosts as network namespaces (this file's tree: a test helper, not code
#: under measurement)
TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")

PRODUCER = """
import asyncio, sys, time
from aiojobqueue import JobQueue
async def main(url, prefix, n, gap):
    async with JobQueue(url, prefix=prefix) as q:
        for _ in range(3):  # warm-up: connections, statement caches
            await q.enqueue("t", {"ts": -1.0})
            await asyncio.sleep(0.2)
        for _ in range(n):
            await q.enqueue("t", {"ts": time.time()})
            await asyncio.sleep(gap)
asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
"""


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


class Target:
    def __init__(self, db: str, tmp: str) -> None:
        self.db = db
        self.tmp = tmp

    def fresh(self) -> tuple[str, str]:
        """(url, prefix) for a new, empty queue."""
        prefix = f"wk{uuid.uuid4().hex[:8]}_"
        url = URLS[self.db] or f"sqlite+aiosqlite:///{self.tmp}/{prefix}.db"
        return url, prefix

    async def drop(self, url: str, prefix: str) -> None:
        if self.db == "sqlite":
            for s in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(url.split("///", 1)[1] + s)
            return
        engine = create_async_engine(url)
        try:
            async with engine.begin() as conn:
                await conn.run_sync(build_tables(prefix).metadata.drop_all)
        finally:
            await engine.dispose()


async def _serving(q: JobQueue) -> asyncio.Task[None]:
    task = asyncio.create_task(q.serve())
    await asyncio.sleep(1.0)
    return task


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


# -- wake latency ---------------------------------------------------------------------------
async def wake(t: Target, n: int, gap: float, host: Host | None = None) -> list[float]:
    """Latencies (ms) of n enqueues from another process, ``gap`` s apart (on ``host``: in
    its network namespace, over its link)."""
    url, prefix = t.fresh()
    q = JobQueue(url, prefix=prefix)
    lat: list[float] = []

    @q.handler("t")
    async def handler(ctx: Any, ts: float) -> None:
        if ts > 0:
            lat.append((time.time() - ts) * 1000)

    try:
        async with q:
            worker = await _serving(q)
            try:
                env = {**os.environ, "PYTHONPATH": ROOT}
                cmd = [sys.executable, "-c", PRODUCER, url if host is None else host.url(url),
                       prefix, str(n), str(gap)]
                if host is not None:
                    cmd = ["ip", "netns", "exec", host.ns, *cmd]
                proc = await asyncio.create_subprocess_exec(*cmd, env=env, cwd=ROOT)
                await proc.wait()
                deadline = time.monotonic() + 10
                while len(lat) < n and time.monotonic() < deadline:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
            finally:
                await _stop(worker)
    finally:
        await t.drop(url, prefix)
    return lat


FORWARD = """
import sys
sys.path.insert(0, sys.argv[3])
from netkit import Forwarder
f = Forwarder(sys.argv[1], ("127.0.0.1", int(sys.argv[2]))).start()
print(f.port, flush=True)
sys.stdin.read()
f.stop()
"""


class Host:
    """Another host: a network namespace on a bridge (tests/netkit.py), reaching the server
    through a forwarder on the bridge's address (the servers listen on 127.0.0.1 only), in a
    process of its own."""

    def __init__(self) -> None:
        sys.path.insert(0, TESTS)
        from netkit import Net

        self.net = Net(1)
        self.ns = self.net.ns[0]
        self._fwd: dict[int, tuple[asyncio.subprocess.Process, int]] = {}

    @staticmethod
    def possible() -> bool:
        """Namespaces need root and ``ip``."""
        return os.geteuid() == 0 and shutil.which("ip") is not None

    async def __aenter__(self) -> Host:
        try:
            self.net.up()
        except BaseException:
            self.net.down()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        for proc, _ in self._fwd.values():
            if proc.stdin is not None:
                proc.stdin.close()
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        self.net.down()

    async def forward(self, port: int) -> None:
        """A forwarder from the bridge to 127.0.0.1:``port``."""
        if port in self._fwd:
            return
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", FORWARD, self.net.gateway, str(port), TESTS,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        assert proc.stdout is not None
        self._fwd[port] = (proc, int((await proc.stdout.readline()).decode()))

    def url(self, url: str) -> str:
        """``url`` as this host reaches the server (forward() its port first)."""
        u = make_url(url)
        return u.set(host=self.net.gateway, port=self._fwd[u.port or 0][1]).render_as_string(
            hide_password=False)


UPSTREAM = """
import asyncio, sys, time
from aiojobqueue import JobQueue
async def main(url, prefix, secs):
    q = JobQueue(url, prefix=prefix)
    @q.handler("a")
    async def a(ctx, i):
        print(i, time.time(), flush=True)
    async with q:
        serving = asyncio.create_task(q.serve())
        await asyncio.sleep(secs)
        serving.cancel()
        try:
            await serving
        except asyncio.CancelledError:
            pass
asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
"""


async def next_start(t: Target, n: int, gap: float) -> list[float]:
    """Latencies (ms) from "a" returning in another process to its dependent "b" starting
    in this one, n chains ``gap`` s apart."""
    url, prefix = t.fresh()
    q = JobQueue(url, prefix=prefix)
    started: dict[int, float] = {}

    @q.handler("b")
    async def b(ctx: Any, i: int) -> None:
        started[i] = time.time()

    try:
        async with q:
            worker = await _serving(q)
            env = {**os.environ, "PYTHONPATH": ROOT}
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", UPSTREAM, url, prefix, str(3 + n * gap + 3), env=env,
                stdout=asyncio.subprocess.PIPE, cwd=ROOT)
            try:
                await asyncio.sleep(2.5)  # the other worker is up and idle
                for i in range(n):
                    async with q.batch() as bt:
                        a = bt.add("a", {"i": i})
                        bt.add("b", {"i": i}, depends_on=[a])
                    await asyncio.sleep(gap)
                out, _ = await proc.communicate()
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
                await _stop(worker)
    finally:
        await t.drop(url, prefix)
    ended = {int(i): float(ts) for i, ts in (ln.split() for ln in out.decode().splitlines())}
    return [(started[i] - ended[i]) * 1000 for i in ended if i in started]


# -- idle cost --------------------------------------------------------------------------------
async def _fill(t: Target, q: JobQueue, rows: int) -> None:
    """About ``rows`` finished jobs in the table: 1,000 enqueued, then doubled in SQL."""
    async with q.batch() as b:
        for _ in range(min(rows, 1000)):
            b.add("t", {"ts": 0})
    J = q._t.jobs.name
    cols = ("type, kind, state, args, group_key, weight, priority, pending, run_after, "
            "attempts, max_attempts, attempt_limit, created_at, finished_at, has_dependents")
    async with q.engine.begin() as conn:
        await conn.execute(text(f"UPDATE {J} SET state = 'done', finished_at = created_at, "
                                "attempts = 1"))
    have = min(rows, 1000)
    while have < rows:
        async with q.engine.begin() as conn:
            await conn.execute(text(f"INSERT INTO {J} ({cols}) SELECT {cols} FROM {J}"))
        have *= 2


async def idle(t: Target, rows: int, window: float) -> tuple[float, float | None, int]:
    """(statements/s an idle worker sends, median ms of one bell look or None, rows)."""
    url, prefix = t.fresh()
    q = JobQueue(url, prefix=prefix)

    @q.handler("t")
    async def handler(ctx: Any, ts: float) -> None:
        return None

    sent = [0]
    try:
        async with q:
            await _fill(t, q, rows)
            async with q.engine.connect() as conn:
                n = (await conn.execute(text(f"SELECT COUNT(*) FROM {q._t.jobs.name}"))).scalar()

            @event.listens_for(q.engine.sync_engine, "before_cursor_execute")
            def _count(_c: Any, _cur: Any, stmt: str, *_a: Any) -> None:
                sent[0] += 1
                if os.environ.get("WAKE_DEBUG"):
                    print(" ".join(stmt.split())[:100])

            made: list[Any] = []
            core_ops = _ops_of(q)
            orig = core_ops.listener

            def listener(engine: Any) -> Any:
                lst = orig(engine)
                made.append(lst)
                return lst

            core_ops.listener = listener  # type: ignore[method-assign]
            worker = await _serving(q)
            await asyncio.sleep(2.0)  # past the watch's warm second
            looks0 = getattr(made[0], "looks", 0) if made else 0
            s0, t0 = sent[0], time.monotonic()
            await asyncio.sleep(window)
            secs = time.monotonic() - t0
            looks = (getattr(made[0], "looks", 0) if made else 0) - looks0
            pool = sent[0] - s0
            await _stop(worker)
            look_ms = await _look_ms(t, q) if t.db == "mariadb" else None
    finally:
        await t.drop(url, prefix)
    return (pool + looks) / secs, look_ms, int(n or 0)


async def idle_watches(t: Target, n: int, window: float) -> float:
    """Statements/s one of ``n`` idle bell watches of one queue sends (MySQL: the watches
    alone, each on its own connection as in n worker processes; the pools' backstop poll is
    the idle column's)."""
    url, prefix = t.fresh()
    q = JobQueue(url, prefix=prefix)
    try:
        async with q:
            watches = [_ops_of(q).listener(q.engine) for _ in range(n)]
            tasks = [asyncio.create_task(w.run(lambda _p: None)) for w in watches]
            await asyncio.sleep(3.0)  # connected, past the warm second
            l0, t0 = sum(w.looks for w in watches), time.monotonic()
            await asyncio.sleep(window)
            rate = (sum(w.looks for w in watches) - l0) / (time.monotonic() - t0) / n
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await t.drop(url, prefix)
    return rate


def _ops_of(q: JobQueue) -> Any:
    return q._started().db.ops


async def _look_ms(t: Target, q: JobQueue) -> float:
    from aiojobqueue.dialects.mysql_bell import bell_names

    names = ", ".join(f"'{n}'" for n in bell_names())
    sql = (f"SELECT SUM(CAST(value AS UNSIGNED)) FROM `{q._t.meta.name}` "
           f"WHERE name IN ({names})")
    took = []
    async with q.engine.connect() as conn:
        for _ in range(300):
            t0 = time.perf_counter()
            await conn.exec_driver_sql(sql)
            took.append((time.perf_counter() - t0) * 1000)
    return statistics.median(took)


# -- capacity=1 drain -------------------------------------------------------------------------
async def drain_c1(t: Target, n: int) -> float:
    url, prefix = t.fresh()
    try:
        async with JobQueue(url, prefix=prefix) as q0, q0.batch() as b:
            for _ in range(n):
                b.add("t", {"ts": 0})
        q = JobQueue(url, prefix=prefix, capacity=1)

        @q.handler("t")
        async def handler(ctx: Any, ts: float) -> None:
            return None

        async with q:
            t0 = time.perf_counter()
            await q.run_until_idle()
            return n / (time.perf_counter() - t0)
    finally:
        await t.drop(url, prefix)


def raw_ceiling(db: str, rows: int, tmp: str) -> float | None:
    """The harness's claim1 + finalize1 loop, one client, in a subprocess of its own."""
    if db == "sqlite":
        code = (f"import sys; sys.path.insert(0, {HARNESS!r}); import raw_sqlite as r; "
                f"print(r.run({tmp + '/raw.sqlite'!r}, 'FULL', 1, 1, {rows})['jobs_per_s'])")
    elif db == "mariadb":
        code = (f"import sys; sys.path.insert(0, {HARNESS!r}); import raw_mariadb as r; "
                # (connect's default database is bound at import: rebind it too)
                f"r.DB = 'ajq_wake_raw'; r.connect.__defaults__ = (r.DB, False); "
                f"print(r.run(1, 1, {rows})['jobs_per_s'])")
    else:
        return None
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])


# -- the bell's cost on the hot path (MariaDB) -------------------------------------------------
async def enqueue_rate(t: Target, n: int, bell: bool) -> float:
    import aiojobqueue.dialects.mysql as my

    url, prefix = t.fresh()
    real = my.ring
    if not bell:
        my.ring = lambda conn, meta: None  # type: ignore[assignment]
    try:
        async with JobQueue(url, prefix=prefix) as q:
            for _ in range(20):
                await q.enqueue("t", {"ts": 0})
            t0 = time.perf_counter()
            for _ in range(n):
                await q.enqueue("t", {"ts": 0})
            return n / (time.perf_counter() - t0)
    finally:
        my.ring = real  # type: ignore[assignment]
        await t.drop(url, prefix)


IDLE_WORKER = """
import asyncio, sys
from aiojobqueue import JobQueue
async def main(url, prefix):
    q = JobQueue(url, prefix=prefix)
    @q.handler("t")
    async def t(ctx, ts):
        pass
    async with q:
        await q.serve()
asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def enqueue_ms_watched(t: Target, n: int, gap: float, bell: bool) -> float:
    """Median ms of one enqueue(), ``gap`` s apart, an idle worker in another process (it
    runs each job: every enqueue finds it idle again)."""
    import aiojobqueue.dialects.mysql as my

    url, prefix = t.fresh()
    real = my.ring
    if not bell:
        my.ring = lambda conn, meta: None  # type: ignore[assignment]
    took: list[float] = []
    try:
        async with JobQueue(url, prefix=prefix) as q:
            env = {**os.environ, "PYTHONPATH": ROOT}
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", IDLE_WORKER, url, prefix, env=env, cwd=ROOT)
            try:
                await asyncio.sleep(3.0)  # up and idle
                for _ in range(5):
                    await q.enqueue("t", {"ts": 0})
                for _ in range(n):
                    await asyncio.sleep(gap)
                    t0 = time.perf_counter()
                    await q.enqueue("t", {"ts": 0})
                    took.append((time.perf_counter() - t0) * 1000)
            finally:
                proc.kill()
                await proc.wait()
    finally:
        my.ring = real  # type: ignore[assignment]
        await t.drop(url, prefix)
    return statistics.median(took)


def fmt(x: float | None, nd: int = 0) -> str:
    return "—" if x is None else f"{x:,.{nd}f}"


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dbs", default="sqlite,mariadb,postgresql")
    ap.add_argument("--lat", type=int, default=100, help="warm enqueues, 20 ms apart")
    ap.add_argument("--cold", type=int, default=40, help="cold enqueues, 1.3 s apart")
    ap.add_argument("--chains", type=int, default=15, help="next-start chains, 1.3 s apart")
    ap.add_argument("--parts", default="wake,host,next,idle,c1,bell,fleet",
                    help="what to measure")
    ap.add_argument("--n1", type=int, default=3000, help="jobs per capacity=1 drain")
    ap.add_argument("--pairs", type=int, default=2, help="alternated C=1 / raw pairs")
    ap.add_argument("--big", type=int, default=1_000_000, help="rows of the large table")
    ap.add_argument("--window", type=float, default=10.0, help="idle seconds counted")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ajq-wake-")
    rows: list[list[str]] = []
    notes: list[str] = []
    for db in args.dbs.split(","):
        t = Target(db, tmp)
        parts = set(args.parts.split(","))
        warm = await wake(t, args.lat, 0.02) if "wake" in parts else [0.0]
        cold = await wake(t, args.cold, 1.3) if "wake" in parts else [0.0]
        remote: list[float] | None = None
        if "host" in parts and db != "sqlite" and Host.possible():
            async with Host() as host:
                await host.forward(make_url(URLS[db] or "").port or 0)
                remote = await wake(t, args.cold, 1.3, host)
        chain = await next_start(t, args.chains, 1.3) if "next" in parts else [0.0]
        small = await idle(t, 1000, args.window) if "idle" in parts else (0.0, None, 0)
        big = (await idle(t, args.big, args.window)
               if db == "mariadb" and "idle" in parts and args.big else None)
        c1: list[float] = []
        raw: list[float] = []
        for _ in range(args.pairs if "c1" in parts else 0):
            c1.append(await drain_c1(t, args.n1))
            r = await asyncio.to_thread(raw_ceiling, db, max(args.n1, 3000), tmp)
            if r is not None:
                raw.append(r)
        c1m = statistics.median(c1) if c1 else None
        rawm = statistics.median(raw) if raw else None
        ratio = f"**{c1m / rawm:.2f}**" if rawm and c1m else "—"
        idle_txt = f"{small[0]:.1f} @ {small[2]:,}"
        if big is not None:
            idle_txt += f" / {big[0]:.1f} @ {big[2]:,}"
        look = "—" if small[1] is None else (
            f"{small[1]:.2f} / {big[1]:.2f}" if big and big[1] is not None else f"{small[1]:.2f}")
        rows.append([
            db, f"{pct(warm, 50):.1f} / {pct(warm, 99):.1f}",
            f"{pct(cold, 50):.1f} / {pct(cold, 99):.1f}",
            f"{pct(remote, 50):.1f} / {pct(remote, 99):.1f}" if remote else "—",
            f"{pct(chain, 50):.1f} / {pct(chain, 99):.1f} (n={len(chain)})", idle_txt, look,
            f"{fmt(c1m)} (pairs: {', '.join(fmt(x) for x in c1)})",
            f"{fmt(rawm)} ({', '.join(fmt(x) for x in raw)})" if raw else "—", ratio,
        ])
        if db == "mariadb" and "fleet" in parts:
            one = await idle_watches(t, 1, args.window)
            many = await idle_watches(t, 16, args.window)
            notes.append(f"MariaDB idle bell watches of one queue, statements/s each: 1 watch "
                         f"{one:.2f}, 16 watches {many:.2f} (16 x {many:.2f} = "
                         f"{16 * many:.1f} for the fleet)")
        if db == "mariadb" and "bell" in parts:
            on: list[float] = []
            off: list[float] = []
            for _ in range(args.pairs):
                on.append(await enqueue_rate(t, 500, True))
                off.append(await enqueue_rate(t, 500, False))
            notes.append(
                f"MariaDB bell cost: single enqueue() {statistics.median(on):,.0f}/s rung vs "
                f"{statistics.median(off):,.0f}/s silenced (pairs on/off: "
                + ", ".join(f"{a:,.0f}/{b:,.0f}" for a, b in zip(on, off, strict=True))
                + f"): **{statistics.median(on) / statistics.median(off):.2f}**")
            won: list[float] = []
            woff: list[float] = []
            for _ in range(args.pairs):
                won.append(await enqueue_ms_watched(t, 20, 0.6, True))
                woff.append(await enqueue_ms_watched(t, 20, 0.6, False))
            notes.append(
                f"MariaDB bell cost with an idle worker in another process: one "
                f"enqueue() 0.6 s apart {statistics.median(won):.2f} ms rung (the bell's "
                f"UPDATE) vs {statistics.median(woff):.2f} ms silenced (pairs on/off: "
                + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in zip(won, woff, strict=True))
                + f"): **{statistics.median(won) / statistics.median(woff):.2f}**")
    head = ["database", "wake warm p50 / p99 ms", "wake cold p50 / p99 ms",
            "cold, from another host",
            "next start p50 / p99 ms",
            "idle q/s @ jobs rows", "bell look ms (small / large)", "C=1 jobs/s",
            "raw claim1+finalize1 jobs/s", "C=1 / raw"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    notes.append("idle q/s counts what reaches a server: on PostgreSQL LISTEN sends nothing "
                 "while idle (a keep-alive SELECT 1 every 30 s); SQLite's watch also reads "
                 "PRAGMA data_version every 5 ms in-process (a file read, no server).")
    for n in notes:
        print()
        print(n)
    load = os.getloadavg()
    print(f"\nload average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (2 cores, shared)")


if __name__ == "__main__":
    asyncio.run(main())

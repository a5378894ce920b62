"""What a MariaDB run sends, from the server's own general log: statements per job by kind.

    flock /tmp/bench.lock /work/venv/bin/python bench/mysql_log.py [--jobs 4000]
        [--log /tmp/gl-mysql.log] [--prefix REGEX] -- COMMAND ...

e.g. ``-- python bench/scale.py --dbs mariadb --procs 8``. The general log is on (``SET
GLOBAL general_log``, into ``--log``) only while COMMAND runs, and off again whatever
happens; performance_schema is off on the shared server, so this and SHOW GLOBAL STATUS
are the server's view. Counted: the statements of the connections that named a table of
``--prefix`` (scale.py's ``s<8 hex>_``) at least once, by kind (the claim's census, probes,
picks and leases, the finalize, COMMIT, the bell watch's waits and sleeps, ...), per job;
then the growth of a few SHOW GLOBAL STATUS counters over the run (server-wide: other
clients count too). Keep COMMAND short: the log costs the server too.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections import Counter
from typing import Any

import pymysql

STATUS = ("Questions", "Com_commit", "Com_select", "Com_update", "Handler_commit",
          "Handler_read_key", "Handler_read_next", "Handler_read_prev", "Handler_update",
          "Innodb_row_lock_waits", "Innodb_row_lock_time", "Innodb_deadlocks")

_HEAD = re.compile(r"^(?:\d{6}\s+\d+:\d+:\d+)?\s+(\d+)\s+([A-Z][a-z]+(?: [a-z]+)?)\t?(.*)$")


def status(conn: Any) -> dict[str, int]:
    with conn.cursor() as cur:
        cur.execute("SHOW GLOBAL STATUS")
        return {k: int(v) for k, v in cur.fetchall() if k in STATUS}


def statements(log: str) -> list[tuple[int, str, str]]:
    """(connection id, command, text) of every entry in a general log file."""
    out: list[tuple[int, str, str]] = []
    with open(log, errors="replace") as f:
        for line in f:
            m = _HEAD.match(line.rstrip("\n"))
            if m:
                out.append((int(m.group(1)), m.group(2), m.group(3)))
            elif out:
                tid, cmd, text = out[-1]
                out[-1] = (tid, cmd, text + " " + line.strip())
    return out


def kind(sql: str, prefix: re.Pattern[str]) -> str:
    """A statement's kind, by what aiojobqueue's statements look like."""
    u = " ".join(sql.split())
    up = u.upper()
    rules = [
        ("census_scan" in u, "claim: census"),
        ("idle_scan" in u, "claim: idle pick"),
        ("SLEEP(" in up, "bell watch: sleep"),
        ("GET_LOCK" in up and "SUM(" in up, "bell watch: wait for the baton"),
        ("GET_LOCK" in up or "RELEASE_" in up, "bell watch: locks"),
        ("SUM(CAST" in up, "bell watch: look"),
        ("IS_USED_LOCK" in up or up.startswith("KILL"), "bell: KILL"),
        ("'WAKE:" in up and up.startswith("UPDATE"), "bell: ring"),
        ("AS `BEFORE`" in up, "claim: others probe"),
        (up.startswith("UPDATE") and "'SCHEDULED'" in up, "claim: promotion sweep"),
        ("SKIP LOCKED" in up, "claim: pick"),
        (up.startswith("UPDATE") and "SETSTATE='RUNNING'" in up.replace(" ", ""),
         "claim: lease"),
        (up.startswith("UPDATE") and "SETSTATE='DONE'" in up.replace(" ", ""), "finalize"),
        ("INFORMATION_SCHEMA" in up, "bench sampler"),
    ]
    for hit, name in rules:
        if hit:
            return name
    for word in ("COMMIT", "ROLLBACK", "BEGIN", "SET ", "SELECT @@", "SHOW"):
        if up.startswith(word):
            return word.strip()
    m = re.search(r"(?:FROM|UPDATE|INTO)\s+`?(\w+)`?", u, re.I)
    table = prefix.sub("", m.group(1)) if m else "?"
    return f"{up.split()[0] if up else '?'} {table}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=4000, help="jobs the command runs")
    ap.add_argument("--log", default="/tmp/gl-mysql.log")
    ap.add_argument("--prefix", default=r"\bs[0-9a-f]{8}_")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("no command")
    prefix = re.compile(args.prefix)
    conn = pymysql.connect(host="127.0.0.1", user="root", database="test", autocommit=True)
    if os.path.exists(args.log):
        os.remove(args.log)
    with conn.cursor() as cur:
        cur.execute("SET GLOBAL general_log_file = %s", (args.log,))
        before = status(conn)
        cur.execute("SET GLOBAL general_log = 1")
        try:
            run = subprocess.run(cmd, capture_output=True, text=True)
        finally:
            cur.execute("SET GLOBAL general_log = 0")
    after = status(conn)
    sys.stdout.write(run.stdout)
    if run.returncode:
        sys.stderr.write(run.stderr[-3000:])
    entries = statements(args.log)
    ours = {tid for tid, _cmd, text in entries if prefix.search(text)}
    kinds = Counter(kind(text, prefix) for tid, cmd, text in entries
                    if cmd == "Query" and tid in ours)
    total = sum(kinds.values())
    n = args.jobs
    print(f"\nstatements of the run's {len(ours)} connections: {total} ({total / n:.2f} "
          f"per job over {n} jobs)")
    for what, c in kinds.most_common():
        print(f"{c:>8} {c / n:>7.3f}/job  {what}")
    print("\nSHOW GLOBAL STATUS, growth over the run (server-wide):")
    for k in STATUS:
        d = after.get(k, 0) - before.get(k, 0)
        print(f"  {k:<24} {d:>10} {d / n:>9.2f}/job")


if __name__ == "__main__":
    main()

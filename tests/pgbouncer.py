"""A throwaway PgBouncer in transaction-pooling mode in front of the test PostgreSQL.

Used by the ``pgbouncer`` session fixture (tests/conftest.py) and by bench/scale.py. Debian's
``pgbouncer`` (1.18: no ``max_prepared_statements``, so no protocol-level prepared statement
survives a transaction) runs in the foreground with its own directory, config and auth file,
on a free port of 127.0.0.1. ``default_pool_size`` is small, so client connections really
share server connections and a test that relied on session state would see it break.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

#: server connections per (database, user): small, so the fleets of the tests share them
POOL_SIZE = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgBouncer:
    """``pgbouncer`` in front of the PostgreSQL at ``pg_url`` (a SQLAlchemy URL).

    ``url`` is ``pg_url`` with the host and port swapped for PgBouncer's; ``users`` are the
    roles the auth file lists (trust: any password). Start with ``start()``, stop with
    ``stop()`` (SIGINT: PgBouncer's safe shutdown, then SIGKILL)."""

    def __init__(self, pg_url: str, *, pool_size: int = POOL_SIZE,
                 users: tuple[str, ...] = ("postgres",), max_client_conn: int = 400) -> None:
        self.pg = make_url(pg_url)
        self.pool_size = pool_size
        self.users = users
        self.max_client_conn = max_client_conn
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="ajq-pgbouncer-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return self.pg.set(host="127.0.0.1", port=self.port).render_as_string(hide_password=False)

    @staticmethod
    def binary() -> str | None:
        return shutil.which("pgbouncer") or next(
            (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.path.exists(p)), None)

    def config(self) -> str:
        host, port = self.pg.host or "127.0.0.1", self.pg.port or 5432
        return f"""[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir}/userlist.txt
pool_mode = transaction
default_pool_size = {self.pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = {self.max_client_conn}
admin_users = postgres
stats_users = postgres
ignore_startup_parameters = extra_float_digits
logfile = {self.dir}/pgbouncer.log
pidfile = {self.dir}/pgbouncer.pid
"""

    def start(self, timeout: float = 15.0) -> None:
        exe = self.binary()
        if exe is None:
            raise FileNotFoundError("pgbouncer is not installed (apt-get install pgbouncer)")
        (self.dir / "pgbouncer.ini").write_text(self.config())
        (self.dir / "userlist.txt").write_text("".join(f'"{u}" ""\n' for u in self.users))
        cmd = [exe, str(self.dir / "pgbouncer.ini")]
        if os.geteuid() == 0:  # it refuses to run as root: drop to the postgres user
            shutil.chown(self.dir, "postgres")
            for f in self.dir.iterdir():
                shutil.chown(f, "postgres")
            cmd[1:1] = ["-u", "postgres"]
        with open(self.dir / "stderr.log", "wb") as err:  # the child keeps its own copy
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = self.log()
                self.stop()
                raise RuntimeError(f"pgbouncer did not start on port {self.port}:\n{log}")
            time.sleep(0.05)

    def log(self) -> str:
        parts = [f.read_text(errors="replace") for f in
                 (self.dir / "pgbouncer.log", self.dir / "stderr.log") if f.exists()]
        return "\n".join(parts)

    def admin(self, command: str) -> list[dict[str, Any]]:
        """A ``SHOW ...`` of the admin console, as rows (simple protocol only: psql)."""
        out = subprocess.run(
            ["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-d",
             "pgbouncer", "-X", "-A", "-F", "\t", "-P", "footer=off", "-c", command],
            capture_output=True, text=True, timeout=10, check=True).stdout.splitlines()
        if not out:
            return []
        head = out[0].split("\t")
        return [dict(zip(head, line.split("\t"), strict=False)) for line in out[1:]]

    def stop(self) -> None:
        p, self.proc = self.proc, None
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

"""What to install when a database driver is missing: one rule for JobQueue (async engine)
and SyncQueue (sync engine), the same words the command line prints."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.engine import URL

from ..errors import MissingDriverError

#: The extra that installs a driver, by (driver module, for SyncQueue's sync engine).
#: aiomysql imports PyMySQL, so a missing pymysql under JobQueue is the [mysql] extra.
_EXTRAS = {("asyncpg", False): "postgresql", ("aiomysql", False): "mysql",
           ("pymysql", False): "mysql", ("psycopg", False): "postgresql-psycopg",
           ("psycopg", True): "postgresql-sync", ("pymysql", True): "mysql-sync"}
#: Drivers SQLAlchemy may import for a URL that no extra brings (pip install the module).
_PLAIN = {"asyncmy", "psycopg2", "mysqldb", "mysqlclient", "aiosqlite"}


@contextmanager
def driver_needed(url: URL, sync: bool = False) -> Iterator[None]:
    """Turn the ModuleNotFoundError of a missing database driver, raised while an engine
    for ``url`` is made, into a MissingDriverError that says what to install (as the
    command line does); any other import error passes unchanged."""
    try:
        yield
    except ModuleNotFoundError as exc:
        name = (exc.name or "").split(".")[0]
        extra = _EXTRAS.get((name, sync))
        if extra is None and name.lower() not in _PLAIN:
            raise
        fix = f'pip install "aiojobqueue[{extra}]"' if extra else f"pip install {name}"
        raise MissingDriverError(
            f"the database driver {name} is not installed (needed for a "
            f"{url.drivername}:// URL{' by SyncQueue' if sync else ''}): {fix}") from exc

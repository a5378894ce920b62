"""Which dialect serves a URL or an engine: the ops class for a backend name, the URL forms
``JobQueue``, ``SyncQueue`` and the command line accept (a plain ``postgresql://``,
``mysql://`` or ``sqlite:///`` gets its driver added), the engine built for a URL, and the
direct URL the PostgreSQL listener uses behind a pooler."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ..schema import Tables
from .drivers import driver_needed

if TYPE_CHECKING:
    from .base import DialectOps


def dialect_for(engine: AsyncEngine, tables: Tables,
                listen_url: URL | None = None) -> DialectOps:
    """Pick the dialect module by SQLAlchemy's dialect name; ``listen_url``: see
    listen_url_for."""
    name = engine.dialect.name
    cls = ops_class_for(name)
    if cls is not None:
        ops = cls(tables)
        ops.listen_url = listen_url
        ops.driver = engine.dialect.driver
        return ops
    from ..errors import UnsupportedDatabaseError

    raise UnsupportedDatabaseError(
        f"unsupported database {name!r}: use SQLite, PostgreSQL or MySQL 8+/MariaDB 10.6+"
    )


def ops_class_for(backend: str) -> type[DialectOps] | None:
    """The dialect module's ops class for a SQLAlchemy backend name, or None."""
    if backend == "postgresql":
        from .postgresql import PostgresOps

        return PostgresOps
    if backend in ("mysql", "mariadb"):  # SQLAlchemy calls MariaDB "mysql" with mysql+ URLs
        from .mysql import MySQLOps

        return MySQLOps
    if backend == "sqlite":
        from .sqlite import SQLiteOps

        return SQLiteOps
    return None


def engine_kwargs_for(url_drivername: str) -> dict[str, Any]:
    """Extra create_async_engine keywords for a URL's driver."""
    cls = ops_class_for(url_drivername.split("+", 1)[0])
    return {} if cls is None else cls.engine_kwargs()


#: schemes SQLAlchemy itself does not know, as users write them (Heroku, Docker images)
_SCHEME_ALIASES = {"postgres": "postgresql"}


def async_url(url: str) -> str:
    """The URL ``JobQueue`` and the command line connect with: a URL naming no driver gets
    its dialect's async one (``postgresql://`` and ``postgres://`` ->
    ``postgresql+asyncpg://``, ``mysql://`` and ``mariadb://`` -> ``mysql+aiomysql://``,
    ``sqlite:///`` -> ``sqlite+aiosqlite:///``); any other URL is returned as given.
    Raises ConfigurationError for a string that is not a database URL."""
    from sqlalchemy.exc import ArgumentError

    from ..errors import ConfigurationError

    text = url.strip()
    scheme, sep, rest = text.partition("://")
    try:
        make_url(text)
    except ArgumentError:
        sep = ""
    if not sep or not scheme:
        raise ConfigurationError(
            f"bad database URL {url!r}: expected e.g. sqlite:///jobs.db, "
            "postgresql://user@host/db or mysql://user@host/db")
    if "+" in scheme:
        return text
    cls = ops_class_for(_SCHEME_ALIASES.get(scheme, scheme))
    return text if cls is None else f"{cls.async_scheme}://{rest}"


def sync_url(url: str) -> str:
    """The URL SyncQueue's own sync engine connects with: an async driver (or none) is
    swapped for its dialect's sync one (``postgresql+asyncpg://`` -> ``postgresql+psycopg://``,
    ``mysql+aiomysql://`` -> ``mysql+pymysql://``, ``sqlite+aiosqlite:///`` ->
    ``sqlite+pysqlite:///``); a sync driver's URL is returned as given."""

    u = make_url(async_url(url))
    cls = ops_class_for(u.get_backend_name())
    if cls is None or u.drivername != cls.async_scheme:
        return u.render_as_string(hide_password=False)
    return u.set(drivername=cls.sync_scheme).render_as_string(hide_password=False)


def engine_for_url(url: str, **kwargs: Any) -> AsyncEngine:
    """An async engine for ``url`` as aiojobqueue connects: the async driver added (see
    async_url), the dialect's URL adjustments and engine keywords applied (``kwargs``
    win)."""

    u = make_url(async_url(url))
    cls = ops_class_for(u.get_backend_name())
    if cls is not None:
        u = cls.normalize_url(u)
    with driver_needed(u):
        return create_async_engine(u, **{**engine_kwargs_for(u.drivername), **kwargs})


async def connect_kwargs_for(url: URL) -> dict[str, Any]:
    """The driver options DialectOps.connect_args finds for ``url`` (none for an unknown
    backend)."""
    cls = ops_class_for(url.get_backend_name())
    return {} if cls is None else await cls.connect_args(url)


async def open_engine(url: str, pool_size: int) -> AsyncEngine:
    """The engine a queue builds from ``url``: engine_for_url's, with a pool of
    ``pool_size`` connections and no overflow, and the driver options what ``url`` reaches
    needs (connect_kwargs_for)."""
    from sqlalchemy.pool import QueuePool

    u = make_url(url)
    cls = ops_class_for(u.get_backend_name())
    if cls is not None:
        u = cls.normalize_url(u)
    kwargs: dict[str, Any] = {}
    # no overflow: SQLAlchemy's would open and close a connection per burst (measured: a
    # worker of capacity 16 ran 2-10x slower on 5 + 10 overflow than on 5)
    dialect: Any = u.get_dialect()
    if issubclass(dialect.get_pool_class(u), QueuePool):  # (not SQLite in memory)
        kwargs.update(pool_size=pool_size, max_overflow=0)
    with driver_needed(u):
        connect = await connect_kwargs_for(u)
    if connect:
        base = engine_kwargs_for(u.drivername).get("connect_args", {})
        kwargs["connect_args"] = {**base, **connect}
    return engine_for_url(url, **kwargs)


def listen_url_for(url: str | AsyncEngine, listen_url: str | None) -> URL | None:
    """JobQueue's ``listen_url`` parsed and checked by the dialect of the queue's own
    ``url`` or engine; None stays None."""

    from ..errors import ConfigurationError

    if listen_url is None:
        return None
    try:
        backend = (url.dialect.name if isinstance(url, AsyncEngine)
                   else make_url(url).get_backend_name())
    except Exception as exc:
        raise ConfigurationError(f"bad url {url!r}: {exc}") from exc
    try:
        parsed = make_url(listen_url)
    except Exception as exc:
        raise ConfigurationError(f"bad listen_url {listen_url!r}: {exc}") from exc
    cls = ops_class_for(backend)
    if cls is None:
        raise ConfigurationError(f"listen_url: unsupported database {backend!r}")
    return cls.parse_listen_url(parsed)


def sync_ops_for(url: str) -> tuple[type[DialectOps], URL]:
    """The ops class and sync-driver URL of ``url`` (SyncQueue's own inserts); raises
    UnsupportedDatabaseError or, for a database workers cannot share, ConfigurationError."""
    from ..errors import UnsupportedDatabaseError

    sync = make_url(sync_url(url))
    ops = ops_class_for(sync.get_backend_name())
    if ops is None:
        raise UnsupportedDatabaseError(
            f"unsupported database {sync.get_backend_name()!r}: use SQLite, PostgreSQL "
            "or MySQL 8+/MariaDB 10.6+")
    ops.check_shared(sync)
    return ops, sync


def async_url_of(url: str) -> str:
    """The async-driver URL of ``url``: JobQueue's for a URL naming no driver or an async
    one; a sync driver's is swapped for its dialect's async driver."""
    u = make_url(async_url(url))
    cls = ops_class_for(u.get_backend_name())
    if cls is None:
        return url  # JobQueue refuses it, with its own error
    if u.drivername == cls.async_scheme or u.get_driver_name() in ("asyncmy", "aiosqlite"):
        return u.render_as_string(hide_password=False)
    return u.set(drivername=cls.async_scheme).render_as_string(hide_password=False)


#: The async drivers, and the extra that installs each (aiosqlite comes with the package).
ASYNC_DRIVERS = {"asyncpg": "postgresql", "psycopg": "postgresql-psycopg", "aiomysql": "mysql",
                 "aiosqlite": ""}


def sqlite_file(url: str) -> Path | None:
    """The file a SQLite URL names (None for another database or ``:memory:``)."""
    u = make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    return Path(u.database)

"""Databases that another framework configured and connected (Django): the URL of one of
its ``DATABASES`` entries, and the SQLAlchemy dialect that can drive a DB-API connection it
opened. What this knows of each database lives here, with the rest of the dialect seam; the
Django integration (contrib/django) asks."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import URL

from ..errors import ConfigurationError

#: a DB-API module -> the SQLAlchemy dialect that drives its connections
DBAPI_DIALECTS = {"sqlite3": "sqlite+pysqlite", "psycopg": "postgresql+psycopg",
                  "psycopg2": "postgresql+psycopg2", "MySQLdb": "mysql+mysqldb",
                  "pymysql": "mysql+pymysql"}


def django_url(settings_dict: dict[str, Any]) -> str:
    """The SQLAlchemy URL (default drivers) of one Django ``DATABASES`` entry. Raises
    ConfigurationError for a database workers cannot share or aiojobqueue does not run on."""
    engine = str(settings_dict.get("ENGINE", ""))
    name = settings_dict.get("NAME")
    if engine.endswith("sqlite3"):
        if not name or str(name) == ":memory:" or str(name).startswith("file:"):
            raise ConfigurationError(
                "aiojobqueue needs a SQLite database file that worker processes can open, "
                f"not {name!r}")
        return f"sqlite:///{name}"
    kind = ("postgresql" if "postgresql" in engine or "postgis" in engine
            else "mysql" if "mysql" in engine else None)
    if kind is None:
        raise ConfigurationError(
            f"aiojobqueue runs on SQLite, PostgreSQL and MySQL/MariaDB, not {engine!r}")
    port = settings_dict.get("PORT")
    url = URL.create(kind, username=settings_dict.get("USER") or None,
                     password=settings_dict.get("PASSWORD") or None,
                     host=settings_dict.get("HOST") or None,
                     port=int(port) if port else None, database=name or None)
    return url.render_as_string(hide_password=False)


def dbapi_dialect(raw: Any) -> str | None:
    """The SQLAlchemy dialect (``name+driver``) for the DB-API connection ``raw``, by its
    module; None where SQLAlchemy has none for it."""
    module = type(raw).__module__.split(".")[0]
    if module == "sqlite3" or module.startswith("_sqlite"):
        module = "sqlite3"
    return DBAPI_DIALECTS.get(module)


def borrowed_engine_kwargs(dialect: str) -> dict[str, Any]:
    """``create_engine`` keywords for an engine over a borrowed connection of ``dialect``:
    on PostgreSQL, no hstore OID look-up at first connect (a query of SQLAlchemy's own on
    a connection that is the lender's)."""
    return {"use_native_hstore": False} if dialect.startswith("postgresql") else {}

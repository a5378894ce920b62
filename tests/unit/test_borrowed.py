"""dialects/borrowed.py: a Django ``DATABASES`` entry's URL and the dialect of a DB-API
connection another framework opened; bad input is a ConfigurationError."""

from __future__ import annotations

import sqlite3

import pytest

from aiojobqueue.dialects.borrowed import borrowed_engine_kwargs, dbapi_dialect, django_url
from aiojobqueue.errors import ConfigurationError


def test_the_url_of_each_database() -> None:
    assert django_url({"ENGINE": "django.db.backends.sqlite3", "NAME": "/tmp/x.db"}) == (
        "sqlite:////tmp/x.db")
    assert django_url({"ENGINE": "django.db.backends.postgresql", "NAME": "app",
                       "USER": "u", "PASSWORD": "p@ss", "HOST": "db", "PORT": "5433"}) == (
        "postgresql://u:p%40ss@db:5433/app")
    assert django_url({"ENGINE": "django.contrib.gis.db.backends.postgis", "NAME": "g"}) == (
        "postgresql:///g")
    assert django_url({"ENGINE": "django.db.backends.mysql", "NAME": "app", "HOST": "h",
                       "PORT": ""}) == "mysql://h/app"


@pytest.mark.parametrize("entry", [
    {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
    {"ENGINE": "django.db.backends.sqlite3", "NAME": "file:memdb?mode=memory"},
    {"ENGINE": "django.db.backends.sqlite3"},
    {"ENGINE": "django.db.backends.oracle", "NAME": "x"},
])
def test_a_database_workers_cannot_share_or_use_is_refused(entry: dict[str, str]) -> None:
    with pytest.raises(ConfigurationError):
        django_url(entry)


def test_the_dialect_of_a_dbapi_connection() -> None:
    raw = sqlite3.connect(":memory:")
    try:
        assert dbapi_dialect(raw) == "sqlite+pysqlite"
    finally:
        raw.close()
    assert dbapi_dialect(object()) is None  # (builtins: no dialect drives it)
    assert borrowed_engine_kwargs("postgresql+psycopg") == {"use_native_hstore": False}
    assert borrowed_engine_kwargs("mysql+pymysql") == {}

"""Alembic's environment for an app that shares its database with aiojobqueue.

``target_metadata`` holds the app's tables and the queue's (models.py). ``include_name``
keeps autogenerate to the tables this metadata names: a database shared with other apps
(or other queues, under other prefixes) keeps theirs out of this app's migrations.
``include_object`` (aiojobqueue's) keeps out the indexes the queue builds on PostgreSQL and
SQLite only, which MySQL/MariaDB would otherwise see missing.
"""

from __future__ import annotations

import os
from typing import Any

from alembic import context
from models import APP_PREFIX, metadata
from sqlalchemy import create_engine

from aiojobqueue.schema import include_object

config = context.config
target_metadata = metadata
URL = os.environ.get("DATABASE_URL", "sqlite:///app.db")


def include_name(name: str | None, type_: str, parent_names: dict[str, Any]) -> bool:
    """Only the tables of target_metadata (other kinds of names: as Alembic decides)."""
    if type_ == "table":
        return name in target_metadata.tables
    return True


def run_migrations_offline() -> None:
    context.configure(url=URL, target_metadata=target_metadata, literal_binds=True,
                      include_name=include_name, include_object=include_object,
                      version_table=f"{APP_PREFIX}alembic_version")
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = create_engine(URL)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata,
                          compare_type=True, include_name=include_name,
                          include_object=include_object,
                          version_table=f"{APP_PREFIX}alembic_version")
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()

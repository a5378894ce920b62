"""The app's tables, and aiojobqueue's built into the same metadata, so that
``alembic revision --autogenerate`` knows both: it neither drops the queue's tables nor
re-creates them, and never writes a step for them (aiojobqueue upgrades its own tables:
``aiojobqueue migrate``, or the queue at start).

The queue's prefix must be the one the app's queue uses (``JobQueue(url, prefix=...)``);
with the default ``ajq_``, ``target_metadata = [metadata, aiojobqueue.metadata]`` in env.py
does the same.
"""

from __future__ import annotations

import os

from sqlalchemy import Column, DateTime, Integer, MetaData, String, Table, func

from aiojobqueue.schema import build_tables

#: the queue's table prefix (the app's JobQueue / SyncQueue use the same)
QUEUE_PREFIX = os.environ.get("AIOJOBQUEUE_PREFIX", "ajq_")
#: the app's own tables (an app prefix only so that several copies share a test database)
APP_PREFIX = os.environ.get("APP_PREFIX", "app_")

metadata = MetaData()

notes = Table(
    f"{APP_PREFIX}notes", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("title", String(200), nullable=False),
    Column("created_at", DateTime(timezone=True), server_default=func.now()),
)

queue_tables = build_tables(QUEUE_PREFIX, metadata=metadata)

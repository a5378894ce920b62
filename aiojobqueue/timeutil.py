"""Time from the database clock (see dialects/columns.py, where its storage per dialect is
defined): every lease and run_after is computed by the database, so workers on several hosts
never compare their own clocks."""

from .dialects.columns import UTCDateTime, as_utc, db_now, utcnow_plus

__all__ = ["UTCDateTime", "as_utc", "db_now", "utcnow_plus"]

"""Logging: what aiojobqueue logs, how a user sees it, and the command line's setup.

aiojobqueue logs through the stdlib ``logging`` module under the ``aiojobqueue`` logger
(``aiojobqueue.jobs`` has one record per attempt start/end). Every job-related record has
the ``extra`` attributes ``job_id``, ``job_type``, ``attempt``, ``worker`` and ``group``, so
a formatter or a JSON log shipper can index them.

Visible without configuration: the library adds no handler, not even a ``NullHandler``, so
when the application configured none (a script; an app under uvicorn, which configures only
its own loggers) Python's last-resort handler prints WARNING and above to stderr. At WARNING
and above are: a failed attempt that will be retried, a job failing for good (ERROR), a
shutdown waiting on running jobs and cancelling those left, a lost database connection and
each retry of it (heartbeat, claim, finalize, side loops), a lease lost, a hook that raised.
Routine events (an attempt starting or succeeding) are INFO/DEBUG, and per-job records are
not even built unless their level is enabled. Silence or route them the usual way::

    logging.getLogger("aiojobqueue").setLevel(logging.ERROR)   # only final failures
    logging.getLogger("aiojobqueue.jobs").setLevel(logging.ERROR)  # no per-attempt lines
    logging.getLogger("aiojobqueue").propagate = False  # with a handler of your own on it
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

#: The ``extra`` attributes of job-related records.
JOB_FIELDS = ("job_id", "job_type", "attempt", "worker", "group")


class JSONFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the job fields if present."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for f in JOB_FIELDS:
            if hasattr(record, f):
                out[f] = getattr(record, f)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def brief(exc: BaseException) -> str:
    """An exception in one line for a warning: the driver's own error without the SQL
    statement and parameters SQLAlchemy appends (a lost connection reads as itself)."""
    from sqlalchemy.exc import StatementError

    inner: BaseException = exc
    if isinstance(exc, StatementError) and isinstance(exc.orig, BaseException):
        inner = exc.orig
    text = str(inner).strip().splitlines()
    first = text[0] if text else ""
    return (f"{type(inner).__name__}: {first}" if first else type(inner).__name__)[:300]


def configure(level: str = "info", fmt: str = "text") -> None:
    """Send aiojobqueue's records (and the root logger's) to stderr as text or JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JSONFormatter())
    else:
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())

"""Logging setup for the command line, and the job fields every job-related record carries.

aiojobqueue logs through the stdlib ``logging`` module under the ``aiojobqueue`` logger
(``aiojobqueue.jobs`` has one record per attempt start/end). Every job-related record has
the ``extra`` attributes ``job_id``, ``job_type``, ``attempt``, ``worker`` and ``group``, so
a formatter or a JSON log shipper can index them. The library itself installs no handler.
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

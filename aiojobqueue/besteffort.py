"""Helpers for best-effort work (progress writes, metric reads): what must never fail a job.

A best-effort write that the database refuses is logged and dropped or retried later; a
long outage would log it on every try, so the warning is throttled per process.
"""

from __future__ import annotations

import threading
import time


class Throttle:
    """``due()`` is true at most once per ``every`` seconds; the calls in between are
    counted, and ``suppressed_text()`` says how many were (then starts counting again)."""

    def __init__(self, every: float) -> None:
        self.every = every
        self._last = -float("inf")
        self._suppressed = 0
        self._lock = threading.Lock()  # metrics read from other threads too

    def due(self) -> bool:
        """True if a warning may be logged now; else counts one suppressed."""
        now = time.monotonic()
        with self._lock:
            if now - self._last >= self.every:
                self._last = now
                return True
            self._suppressed += 1
            return False

    def suppressed_text(self) -> str:
        """`` (N more like it not logged)`` since the last logged one, or an empty string."""
        with self._lock:
            n, self._suppressed = self._suppressed, 0
        return f" ({n} more like it not logged)" if n else ""

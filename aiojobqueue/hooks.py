"""Lifecycle hooks a user can attach metrics or tracing to."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from typing import Any

log = logging.getLogger("aiojobqueue.hooks")

EVENTS = ("start", "done", "failed", "cancelled", "released", "discarded")


class Hooks:
    """Callbacks per event; a failing hook is logged and never affects the job."""

    def __init__(self) -> None:
        self._fns: dict[str, list[Callable[..., Any]]] = defaultdict(list)

    def add(self, event: str, fn: Callable[..., Any]) -> None:
        if event not in EVENTS:
            raise ValueError(f"unknown hook event {event!r}; one of {EVENTS}")
        self._fns[event].append(fn)

    def emit(self, event: str, *args: Any) -> None:
        for fn in self._fns.get(event, ()):
            try:
                fn(*args)
            except Exception:
                log.exception("hook %r for %s raised", fn, event)

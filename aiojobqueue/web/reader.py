"""What every dashboard read shares: the queue's tables, statements built once per shape,
a connection per read, and the capped count."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import func, literal, select
from sqlalchemy.ext.asyncio import AsyncConnection

from .. import schema as S
from ..sql import in_state
from . import views as V

if TYPE_CHECKING:
    from ..queue import JobQueue

T = TypeVar("T")


class Reader:
    """The dashboard's reads for one queue share this state."""

    def __init__(self, queue: JobQueue) -> None:
        self.q = queue
        self.t = S.build_tables(queue.prefix)
        # Statements built once per shape, values bound per call: SQLAlchemy then reuses
        # their cache keys and compiled forms (building the wide ones costs more than
        # running them on small tables).
        self._stmts: dict[Any, Any] = {}
        self._covered: set[str] | None = None

    def _stmt(self, key: Any, build: Callable[[], Any]) -> Any:
        got = self._stmts.get(key)
        if got is None:
            got = self._stmts[key] = build()
        return got

    async def _read(self, fn: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        async with self.q.engine.connect() as conn:
            return await fn(conn)


    def _capped(self, state: str, *where: Any, order: Any = None, cap: int | None = None) -> Any:
        """``count(*)`` of ``state`` rows (and ``where``), stopping past ``cap``. ``order``
        (a column of the index to use) keeps a planner from choosing a table scan that
        expects matches spread evenly when they sit together at the end."""
        J = self.t.jobs
        n = V.CAP if cap is None else cap
        inner = select(literal(1).label("x")).where(*in_state(J, state), *where)
        if order is not None:
            inner = inner.order_by(order)
        inner = inner.limit(n + 1)
        return select(func.count()).select_from(inner.subquery()).scalar_subquery()



async def first_row(conn: AsyncConnection, stmt: Any,
                 params: dict[str, Any] | None = None) -> Sequence[Any]:
    row = (await conn.execute(stmt, params or {})).first()
    assert row is not None
    return tuple(row)


def min_cap(a: int | None, b: int) -> int:
    return b if a is None else min(a, b)


def error_line(error: Any) -> str | None:
    if not isinstance(error, dict):
        return None
    line = f"{error.get('type', '')}: {error.get('message', '')}".strip(": ")
    return line[:160] or None


def types_of(v: Any) -> list[str] | None:
    if v is None:
        return None
    if isinstance(v, str):
        import json

        try:
            v = json.loads(v)
        except ValueError:
            return [t for t in v.split(",") if t]
    return [str(t) for t in v] if isinstance(v, (list, tuple)) else None



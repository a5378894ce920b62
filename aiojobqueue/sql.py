"""Small SQL helpers shared by the statements of the claim, the finalize and the settle."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from sqlalchemy import Integer, bindparam, literal_column, select

T = TypeVar("T")

#: The most ids one statement names (an IN list, an expanding bind, ``= ANY(:ids)``). Far
#: under every driver's limit on bound parameters (SQLite 32,766, MySQL 65,535, asyncpg
#: 32,767), and small enough that one statement's row locks are released in one short step.
CHUNK = 1000


def chunks(ids: Sequence[T]) -> Iterator[Sequence[T]]:
    """``ids`` in consecutive slices of at most ``CHUNK``: one statement each."""
    for i in range(0, len(ids), CHUNK):
        yield ids[i : i + CHUNK]


def lit(state: str) -> Any:
    """A state as a SQL literal: keeps PostgreSQL's generic plans on the partial indexes."""
    return literal_column(f"'{state}'")


def in_state(jobs: Any, state: str) -> list[Any]:
    """The terms that select the rows of ``state`` as its partial indexes want them: the
    state as a literal, and for waiting rows the always-true ``pending > 0`` of
    ``schema.overview_indexes`` (SQLite uses a partial index only for a query that repeats
    its terms)."""
    terms = [jobs.c.state == lit(state)]
    if state == "waiting":
        terms.append(jobs.c.pending > literal_column("0"))
    return terms


#: LIMIT 1 as a literal (SQLAlchemy binds a LIMIT's number: see opaque)
ONE: Any = literal_column("1")


def opaque(name: str) -> Any:
    """The integer bind ``name`` as ``(SELECT :name)``: where a LIMIT or a bound of a
    prepared statement is a plain bind, PostgreSQL's estimates follow its value, so the
    plan made for the values at hand looks cheaper than the generic one and the statement
    is planned again at every call (measured: the census and the idle pick, 0 generic plans
    in 70 calls). Behind a sub-select the value is unknown to both plans alike."""
    return select(bindparam(name, type_=Integer())).scalar_subquery()

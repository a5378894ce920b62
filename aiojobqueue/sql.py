"""Small SQL helpers shared by the statements of the claim, the finalize and the settle."""

from __future__ import annotations

from typing import Any

from sqlalchemy import literal_column


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

"""Small SQL helpers shared by the statements of the claim, the finalize and the settle."""

from __future__ import annotations

from typing import Any

from sqlalchemy import literal_column


def lit(state: str) -> Any:
    """A state as a SQL literal: keeps PostgreSQL's generic plans on the partial indexes."""
    return literal_column(f"'{state}'")

"""The ``groups`` table's rows: every group a job was ever inserted under has one
(``explain()`` and the dashboard's overview read the groups from it; the claim's census
reads ``ix_ready`` instead).

``GroupRows`` gives each group its row inside the insert that first uses it, and remembers
the groups seen committed, so an insert of a known group skips the look-up (and may be the
single bulk statement: Inserter._lone).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from .database import Database


class GroupRows:
    """This process's knowledge of the ``groups`` rows (see the module docstring)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        #: groups known to have their row (inserts skip the look-up for them)
        self.known: set[str] = set()

    async def ensure(self, conn: AsyncConnection, groups: list[str]) -> None:
        """Give every group in ``groups`` its row (inside the caller's insert)."""
        new = [g for g in groups if g not in self.known]
        if not new:
            return
        G = self.db.t.groups
        stmt = select(G.c.group_key).where(G.c.group_key.in_(new))
        have = {r[0] for r in await conn.execute(stmt)}
        missing = [{"group_key": g} for g in new if g not in have]
        if missing:
            await self.db.ops.insert_ignore(conn, G, missing)
        # Cache only rows seen committed: this transaction may still roll back.
        self.known.update(have)

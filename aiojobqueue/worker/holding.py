"""Held slots, the worker's side (docs/scheduling.md "Held slots"): under a counted cap a
hand-over may lease jobs ahead into ``leased`` (slots.Slots.take_over); the worker keeps them
by group (``WorkerState.held``) and starts one only in a slot of that group it holds, when
that slot's job ends (``next_for``, ``start_waiting``); the round that writes the ended job's
outcome makes the held row ``running`` in its place (held.swap_in). Held jobs go back
(``give_back``) when the hand-over stops applying to their group, past this process's share,
and at shutdown.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from .. import threads
from ..claimed import Claimed

if TYPE_CHECKING:
    from .loop import Worker


class Holding:
    """The held jobs of Worker ``w`` (see the module docstring)."""

    def __init__(self, w: Worker) -> None:
        self.w = w

    def next_for(self, c: Claimed) -> tuple[Claimed, float] | None:
        """A held job of ``c``'s group to start at once in the slot ``c`` just left (its
        row, or the row of the job whose slot ``c`` took, is still ``running`` until the
        round that writes ``c``'s outcome makes the held one ``running`` in its place).
        None where the hand-over no longer applies to that group, or while leases are not
        renewed."""
        state, claimer = self.w.state, self.w.core.claimer
        q = state.held.get(c.group)
        live = claimer.live
        if (not q or state.stopping or claimer.single_group != c.group
                or live.cap(c.group) == 0 or live.generation != claimer.slots.checked
                or not self.w.leases.healthy()
                or (state.share is not None and self.w._active >= state.share)):
            return None
        nxt = q.popleft()
        if not q:
            del state.held[c.group]
        return nxt

    def start_waiting(self) -> None:
        """Held jobs that arrived after their group's jobs ended: each starts in the slot of
        an ended attempt whose outcome still waits in the outbox (that row is counted until
        the outcome is written, which now makes the held row ``running`` first), while a
        handler slot is free. Not an outcome whose earlier write may have committed (its row
        may no longer count)."""
        state, out = self.w.state, self.w.outcomes
        cap = self.w.core.settings.capacity - threads.lingering(self.w.core)
        for i, o in enumerate(out.outbox):
            if not state.held or self.w._active >= cap:
                return
            if (o.swap is not None or o.kind == "released"
                    or (o.job_id, o.attempt) in out.uncertain):
                continue
            r = state.running.get(o.job_id)
            if r is None or r.claimed.attempt != o.attempt:
                continue
            nxt = self.next_for(r.claimed)
            if nxt is not None:
                out.outbox[i] = replace(o, swap=(nxt[0].id, nxt[0].attempt))
                self.w._start(*nxt)

    async def give_back(self) -> None:
        """Release the held jobs of a group the hand-over no longer applies to (another
        group was found, the group was paused), so that no other group waits on them, and
        of a group this worker holds no slot of any more (no job of it here, running,
        ended or about to start: nothing would start them)."""
        state, claimer = self.w.state, self.w.core.claimer
        g, live = claimer.single_group, claimer.live
        slots = {r.claimed.group for r in state.running.values()}
        slots.update(c.group for c, _ in state.buffer)
        # (a change of the policy gives every held job back: see live_policy.py)
        changed = live.generation != claimer.slots.checked
        back: list[Claimed] = []
        for grp in list(state.held):
            if (grp != g or grp not in slots or live.cap(grp) == 0 or changed
                    or state.stopping):
                back += [c for c, _ in state.held.pop(grp)]
        back += self._over_share()
        if back:
            await self.w.leases.give_back(back)

    def _over_share(self) -> list[Claimed]:
        """Held jobs past this process's share of the cap (one per slot of it), newest
        first: other processes serve these types too, and a held job is theirs to run."""
        state, back = self.w.state, []
        extra = state.held_count() - (state.share or state.held_count())
        for grp in list(state.held):
            q = state.held[grp]
            while extra > 0 and q:
                back.append(q.pop()[0])
                extra -= 1
            if not q:
                del state.held[grp]
        return back

"""The stream-id strategy's claims of one job leave this process in slot order.

XADD refuses an ID smaller than the stream's last one, so a claim of slot *S* that
reaches the server after a claim of a later slot loses *S* for good. Within one process
that used to happen whenever a claim of *S* failed (the server restarting, a cut
connection) and the next slot's first claim went out before *S*'s retry. Here a claim
waits until this process's earlier claims of the same job have been answered; a claim
that failed keeps its place for ``HOLD_S``, long enough for the engine's retry (whose
backoff is at most a few seconds), and then lets the later ones go.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

__all__ = ["HOLD_S", "SlotOrder"]

#: How long a failed claim keeps its place before later slots of its job may go ahead.
HOLD_S = 10.0


@dataclass
class _Place:
    answered: asyncio.Future[None]
    failed_at: float | None = field(default=None)


class SlotOrder:
    """Places in line per (event loop, job); each call happens on one loop."""

    def __init__(self) -> None:
        self._lines: dict[tuple[int, str], dict[int, _Place]] = {}

    def _line(self, job: str) -> tuple[asyncio.AbstractEventLoop, dict[int, _Place]]:
        loop = asyncio.get_running_loop()
        return loop, self._lines.setdefault((id(loop), job), {})

    async def wait_turn(self, job: str, slot: int) -> None:
        """Take (or keep) ``slot``'s place and wait until no earlier slot is pending."""
        loop, line = self._line(job)
        place = line.get(slot)
        if place is None:
            place = line[slot] = _Place(loop.create_future())
        place.failed_at = None
        while True:
            now = loop.time()
            for other, held in list(line.items()):
                if held.failed_at is not None and now - held.failed_at > HOLD_S:
                    self._drop(line, other)
            earlier = [held.answered for other, held in line.items() if other < slot]
            if not earlier:
                return
            await asyncio.wait(earlier, timeout=HOLD_S)

    def answered(self, job: str, slot: int) -> None:
        """The server answered ``slot``'s claim: later slots may go."""
        _, line = self._line(job)
        self._drop(line, slot)

    def failed(self, job: str, slot: int) -> None:
        """``slot``'s claim failed: it keeps its place for ``HOLD_S`` for its retry."""
        _, line = self._line(job)
        place = line.get(slot)
        if place is not None:
            place.failed_at = asyncio.get_running_loop().time()

    @staticmethod
    def _drop(line: dict[int, _Place], slot: int) -> None:
        place = line.pop(slot, None)
        if place is not None and not place.answered.done():
            place.answered.set_result(None)

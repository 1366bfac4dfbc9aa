"""The store's clock as this worker sees it: an offset to its own, to arm timers by.

Slots are instants on the store's clock (it judges ``early`` and ``late``). A worker whose
own clock runs ahead by S used to arm its timers S early: each claim was answered
``early``, waited, and came back a round trip behind the other instances' (so it lost
most races), and alone at start it skipped the slots due in its first S seconds. Arming
at ``slot - offset`` on the local clock puts its claims at the slot by the store's clock.
The offset is the midpoint estimate (the store read its clock halfway through the round
trip): the low end of what the round trip allows armed a worker ahead up to a round trip
after the others, and it lost every race to them (a fault run's worker 5 s ahead started
nothing for 12 s). A claim armed by the midpoint still travels half a round trip, so it
does not reach the store before the slot either.

The offset is read from a lease store's optional ``runs.now_ms(job)``, or from a
claim-only store's ``store_now(job)`` when it too answers ``early`` by its own clock
(Redis ``stream-id``: a worker ahead used to send every claim seconds early, each held
its thread and its claim batch until its slot, and a win was acted on only once the whole
batch was answered), at start and then every ``REFRESH_S``; a store without either, or a
read that fails, leaves the offset as it was (0 at first). It only ever moves when a
claim is sent: whether a run may start is still the store's answer to the claim.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ..wallclock import now_ms
from .calls import error_text

__all__ = ["REFRESH_S", "StoreClock", "clock_reader"]

logger = logging.getLogger("django_anarchon")

#: How often the offset is read again (a worker's clock that NTP steps is followed).
REFRESH_S = 60.0
#: Reads per measurement; the one with the shortest round trip is kept.
SAMPLES = 3


def clock_reader(backend: Any) -> Callable[[str], Awaitable[int]] | None:
    """How ``backend`` tells its clock: ``runs.now_ms``, else ``store_now``, else not."""
    read = getattr(backend.runs, "now_ms", None) or getattr(backend, "store_now", None)
    return read if callable(read) else None


class StoreClock:
    """``now()`` on the store's clock; ``local(ms)`` turns a store instant into a local one."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.offset_ms = 0

    def now(self) -> int:
        return now_ms() + self.offset_ms

    def local(self, store_ms: int) -> int:
        return store_ms - self.offset_ms

    async def measure(self, backend: Any, job: str) -> bool:
        """Read the store's clock (around ``job``'s runs); ``False`` if it cannot tell."""
        read = clock_reader(backend)
        if read is None:
            return False
        best: tuple[int, int] | None = None  # (round trip, offset)
        try:
            for _ in range(SAMPLES):
                sent = now_ms()
                store = int(await read(job))
                back = now_ms()
                # The store read its clock somewhere in the round trip, so the offset lies
                # in [store - back, store - sent]; its midpoint is the estimate (module
                # docstring). Clocks that agree within the round trip keep 0 (as ever).
                low, high = store - back, store - sent
                sample = (back - sent, 0 if low <= 0 <= high else (low + high) // 2)
                if best is None or sample[0] < best[0]:
                    best = sample
        except Exception as exc:
            logger.warning("%s: the store's clock could not be read (%s); timers stay armed "
                           "by an offset of %s ms", self.label, error_text(exc), self.offset_ms)
            return False
        assert best is not None
        if abs(best[1] - self.offset_ms) > max(best[0], 1):
            logger.info("%s: the store's clock is %+d ms from this worker's (round trip %d ms); "
                        "timers are armed by the store's", self.label, best[1], best[0])
        self.offset_ms = best[1]
        return True

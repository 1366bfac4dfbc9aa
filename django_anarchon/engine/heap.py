"""The worker process's heap: the garbage collector runs between bursts, not inside them.

A worker imports Django, your apps and every job before its first run, and keeps all of
it until it exits. Python's collector walks every tracked object at each full collection:
measured in a burst of 1,000 runs, one full collection paused the event loop for 100 to
200 ms, longer than the claims themselves. ``settle()`` collects once, then freezes what
is left (``gc.freeze()``), so later collections walk only what the runs themselves made.

What the runs make still cost a burst its collections: a burst's live runs are tens of
thousands of objects, and each young collection inside the burst walked those still alive,
about 100 ms a burst in one Redis worker running bursts of 1,000 (docs/benchmarks.md).
So ``settle()`` also lets many more allocations pass between automatic collections
(``YOUNG_THRESHOLD``), and ``collect_when_quiet()`` collects at a quiet moment instead:
when the process has allocated little since its last look and no timer is due soon. A
worker that is never quiet still has its automatic collections, at the higher threshold.

Only the process that owns its heap does this: ``anarchon_worker``, once every scheduler
has started. A scheduler started inside a web server (``AUTOSTART``) leaves the server's
heap alone.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..wallclock import now_ms

if TYPE_CHECKING:
    from .scheduler import Scheduler

__all__ = ["YOUNG_THRESHOLD", "collect_when_quiet", "quiet", "settle"]

#: Allocations (less deallocations) between two automatic collections of the youngest
#: generation once settled (Python's default is 700, 2,000 from 3.13). More than a burst
#: of 1,000 runs makes, so that its collection waits for the quiet after it.
YOUNG_THRESHOLD = 100_000
#: How often ``collect_when_quiet`` looks, ...
QUIET_LOOK_S = 0.1
#: ... the most allocations since its last look at which the process is quiet, ...
QUIET_MOST_NEW = 1_000
#: ... the fewest since the last collection worth a collection, ...
QUIET_LEAST_YOUNG = 5_000
#: ... and how far off the next timer must be (a collection takes 5 to 50 ms).
QUIET_AHEAD_MS = 250


def settle() -> None:
    """Collect once, then move every object still alive out of future collections."""
    gc.collect()
    gc.freeze()
    young, middle, old = gc.get_threshold()
    if 0 < young < YOUNG_THRESHOLD:  # 0: the collector is off, and stays off
        gc.set_threshold(YOUNG_THRESHOLD, middle, old)


def quiet(young: int, new: int, next_due: int | None, now: int) -> bool:
    """Whether to collect now: ``young`` allocations since the last collection, ``new``
    since the last look, and the next timer at ``next_due`` (ms, ``None``: none)."""
    return (
        young >= QUIET_LEAST_YOUNG
        and abs(new) <= QUIET_MOST_NEW
        and (next_due is None or next_due - now >= QUIET_AHEAD_MS)
    )


async def collect_when_quiet(schedulers: Sequence[Scheduler]) -> None:
    """Collect the young and middle generations whenever the process is quiet (``quiet``);
    every generation by Python's own rule for the oldest: once the middle one has been
    collected its threshold's number of times, and the oldest has grown by a quarter
    since its last collection here. Nothing while the collector is off."""
    last = gc.get_count()[0]
    old_after = 0  # the oldest generation's size after its last collection here
    while True:
        await asyncio.sleep(QUIET_LOOK_S)
        young, _, middles = gc.get_count()
        dues = [due for s in schedulers if (due := s.next_due()) is not None]
        if gc.isenabled() and quiet(young, young - last, min(dues, default=None), now_ms()):
            generation = 1
            if middles >= gc.get_threshold()[2]:
                old = len(gc.get_objects(generation=2))
                generation = 2 if old - old_after >= old_after // 4 else 1
            gc.collect(generation)
            if generation == 2:
                old_after = len(gc.get_objects(generation=2))
            young = gc.get_count()[0]
        last = young

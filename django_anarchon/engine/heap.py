"""The worker process's heap: what start-up built is kept out of the garbage collector's way.

A worker imports Django, your apps and every job before its first run, and keeps all of
it until it exits. Python's collector walks every tracked object at each full collection:
measured in a burst of 1,000 runs, one full collection paused the event loop for 100 to
200 ms, longer than the claims themselves. ``settle()`` collects once, then freezes what
is left (``gc.freeze()``), so later collections walk only what the runs themselves made,
and lets more allocations pass between young collections (``YOUNG_THRESHOLD``). In one
process running bursts of 1,000 sync runs (memory store, docs/benchmarks.md) the
collector's time per burst fell from 190-205 ms to 65-80 ms, and the process's CPU per
burst from 450-465 ms to 275-320 ms.

Only the process that owns its heap calls it: ``anarchon_worker``, once every scheduler
has started. A scheduler started inside a web server (``AUTOSTART``) leaves the server's
heap alone.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "settle"]

#: Allocations between two collections of the youngest generation (Python's default is
#: 700, 2,000 from 3.13): a burst of runs allocates hundreds of thousands of objects, each
#: collection walks those still alive, and most are, until their run ends.
YOUNG_THRESHOLD = 10_000


def settle() -> None:
    """Collect once, then move every object still alive out of future collections."""
    gc.collect()
    gc.freeze()
    young, middle, old = gc.get_threshold()
    if 0 < young < YOUNG_THRESHOLD:  # 0: the collector is off, and stays off
        gc.set_threshold(YOUNG_THRESHOLD, middle, old)

"""This worker's wall clock, in epoch milliseconds: the unit slots and deadlines are in.

Every reading goes through ``time.time_ns``, so the engine, the retries and the backends
read one clock, and a test that moves that clock (a skewed worker) moves them all.
"""

from __future__ import annotations

import time

__all__ = ["now_ms"]


def now_ms() -> int:
    return time.time_ns() // 1_000_000

"""Instants in log lines, shown as the run lines show them: ISO 8601 in UTC.

Slots and deadlines travel as epoch milliseconds; a log line that printed them raw
("slot 1764595200000") could not be read next to one that printed an ISO time.
"""

from __future__ import annotations

import functools

from .backends.base import ms_to_datetime

__all__ = ["iso"]


class iso:  # lower case: it reads as a function at the call sites, iso(slot)
    """An epoch-ms instant, formatted only when the log line is emitted (lazy ``%s``)."""

    __slots__ = ("ms",)

    def __init__(self, ms: int | None) -> None:
        self.ms = ms

    def __str__(self) -> str:
        return "-" if self.ms is None else _text(self.ms)

    __repr__ = __str__


@functools.lru_cache(maxsize=256)
def _text(ms: int) -> str:
    """Cached: the runs of one slot (a burst's thousand) name it in their task names."""
    try:
        return ms_to_datetime(ms).isoformat()
    except (OverflowError, ValueError, OSError):  # outside datetime's years: still say it
        return f"{ms} ms after the epoch"

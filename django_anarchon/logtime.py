"""Instants in log lines, shown as the run lines show them: ISO 8601 in UTC.

Slots and deadlines travel as epoch milliseconds; a log line that printed them raw
("slot 1764595200000") could not be read next to one that printed an ISO time.
"""

from __future__ import annotations

from .backends.base import ms_to_datetime

__all__ = ["iso"]


class iso:  # lower case: it reads as a function at the call sites, iso(slot)
    """An epoch-ms instant, formatted only when the log line is emitted (lazy ``%s``)."""

    __slots__ = ("ms",)

    def __init__(self, ms: int | None) -> None:
        self.ms = ms

    def __str__(self) -> str:
        if self.ms is None:
            return "-"
        try:
            return ms_to_datetime(self.ms).isoformat()
        except (OverflowError, ValueError, OSError):  # outside datetime's years: still say it
            return f"{self.ms} ms after the epoch"

    __repr__ = __str__

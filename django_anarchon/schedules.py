"""Schedules: pure objects that say when a job is due, as integer epoch milliseconds.

Every instance must compute the same slots whenever it started, so nothing here
depends on the process: ``every`` slots sit on a grid anchored at the epoch, and cron
and one-off slots are exact instants. No I/O, no Django database imports.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Literal, Protocol

from .backends.base import datetime_to_ms, ms_to_datetime
from .durations import format_duration

ScheduleType = Literal["every", "cron", "once"]


class Schedule(Protocol):
    """When a job is due."""

    type: ScheduleType

    def next_after(self, after_ms: int) -> int | None:
        """The first slot strictly after ``after_ms``, or ``None`` when there is none."""
        ...

    def latest_at_or_before(self, ms: int) -> int | None:
        """The newest slot at or before ``ms`` (for catch-up), or ``None``."""
        ...

    def min_gap_ms(self) -> float:
        """The smallest gap between two consecutive slots; ``math.inf`` for a one-off."""
        ...

    def describe(self) -> str:
        """How the schedule reads in banners and the admin, e.g. ``every 10s``."""
        ...


class Every:
    """Every ``interval_ms``, on the grid ``k * interval_ms + offset_ms`` since the epoch."""

    type: ScheduleType = "every"

    def __init__(self, interval_ms: int, offset_ms: int = 0) -> None:
        if interval_ms < 1:
            raise ValueError("interval must be at least 1 ms")
        self.interval_ms = interval_ms
        self.offset_ms = offset_ms % interval_ms

    def next_after(self, after_ms: int) -> int | None:
        k = (after_ms - self.offset_ms) // self.interval_ms + 1
        return k * self.interval_ms + self.offset_ms

    def latest_at_or_before(self, ms: int) -> int | None:
        k = (ms - self.offset_ms) // self.interval_ms
        return k * self.interval_ms + self.offset_ms

    def min_gap_ms(self) -> float:
        return self.interval_ms

    def describe(self) -> str:
        text = f"every {format_duration(self.interval_ms)}"
        if self.offset_ms:
            text += f" (offset {format_duration(self.offset_ms)})"
        return text

    def __repr__(self) -> str:
        return f"Every({self.interval_ms}, offset_ms={self.offset_ms})"


class Once:
    """A single instant."""

    type: ScheduleType = "once"

    def __init__(self, at_ms: int) -> None:
        self.at_ms = at_ms

    @classmethod
    def from_datetime(cls, when: datetime) -> Once:
        return cls(datetime_to_ms(when))

    def next_after(self, after_ms: int) -> int | None:
        return self.at_ms if self.at_ms > after_ms else None

    def latest_at_or_before(self, ms: int) -> int | None:
        return self.at_ms if self.at_ms <= ms else None

    def min_gap_ms(self) -> float:
        return math.inf

    def describe(self) -> str:
        return f"at {ms_to_datetime(self.at_ms).isoformat()}"

    def __repr__(self) -> str:
        return f"Once({self.at_ms})"


class Cron:
    """A cron expression evaluated on wall-clock time in an IANA time zone.

    Implemented in the schedules work: 5 or 6 fields (seconds first), @hourly/@daily/
    @weekly/@monthly/@yearly, DST rules of SPEC section 4.
    """

    type: ScheduleType = "cron"

    def __init__(self, expression: str, timezone: str) -> None:
        raise NotImplementedError

    def next_after(self, after_ms: int) -> int | None:
        raise NotImplementedError

    def latest_at_or_before(self, ms: int) -> int | None:
        raise NotImplementedError

    def min_gap_ms(self) -> float:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

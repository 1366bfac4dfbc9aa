"""Schedules: pure objects that say when a job is due, as integer epoch milliseconds.

Every instance must compute the same slots whenever it started, so nothing here
depends on the process: ``every`` slots sit on a grid anchored at the epoch, and cron
and one-off slots are exact instants. No I/O, no Django database imports.

The daylight-saving rules of cron jobs live here with the slot arithmetic they shape,
and so does the preview that shows what they do to a job (:func:`preview`, :class:`Fire`,
used by ``anarchon_jobs --next``, the admin and check anarchon.W004): one place to read
and change them, which is why this module is longer than most.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, Protocol, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from .backends.base import datetime_to_ms, ms_to_datetime
from .durations import format_duration

ScheduleType = Literal["every", "cron", "once"]
#: What a cron job does with a matching wall-clock time that does not exist (spring forward).
GapPolicy = Literal["shift", "skip"]
#: Which occurrence(s) of a matching wall-clock time that happens twice (fall back) fire.
FoldPolicy = Literal["first", "second", "both"]
GAP_POLICIES: tuple[str, ...] = get_args(GapPolicy)
FOLD_POLICIES: tuple[str, ...] = get_args(FoldPolicy)


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


_ALIASES = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NAIVE_EPOCH = datetime(1970, 1, 1)
_MS = timedelta(milliseconds=1)
_SECOND = timedelta(seconds=1)
# Wider than any UTC-offset change in current tzdata (the largest DST shift is 2 h).
_WINDOW_MS = 3 * 3_600_000
_DAY_MS = 86_400_000
_YEAR_MS = 366 * _DAY_MS
_GAP_SLOTS = 500
# A 29 February can be 8 years from the last one (2096 -> 2104).
_MATCH_YEARS = 9
_FIELDS = ("minute", "hour", "day of month", "month", "weekday")
_NAMES = {
    "month": {m: i for i, m in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1)},
    "weekday": {d: i for i, d in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))},
}


FireMark = Literal["", "shifted", "skipped", "fold: first", "fold: second"]


@dataclass(frozen=True)
class Fire:
    """One line of a schedule preview: a slot, or matching wall-clock times a gap swallowed.

    ``wall`` is the local wall clock of the slot (of the first swallowed time when
    ``skipped``, whose ``at_ms`` is ``None``); ``first_moved`` and ``last_moved`` are the
    first and last matching wall-clock times in the gap, for ``shifted`` and ``skipped``.
    """

    at_ms: int | None
    wall: datetime
    zone: str
    mark: FireMark = ""
    first_moved: datetime | None = None
    last_moved: datetime | None = None

    def local_text(self) -> str:
        """The slot in its zone, to the second, with the zone's abbreviation."""
        if self.at_ms is None:
            return self.wall.strftime("%Y-%m-%d %H:%M:%S") + " (not on the clock)"
        return ms_to_datetime(self.at_ms).astimezone(ZoneInfo(self.zone)).strftime(
            "%Y-%m-%d %H:%M:%S %Z")

    def utc_text(self) -> str:
        return "-" if self.at_ms is None else ms_to_datetime(self.at_ms).strftime(
            "%Y-%m-%d %H:%M:%S UTC")

    def to_dict(self) -> dict[str, object]:
        return {"at": None if self.at_ms is None else ms_to_datetime(self.at_ms).isoformat(),
                "local": self.local_text(), "zone": self.zone, "mark": self.mark,
                "dst": self.label()}

    def label(self) -> str:
        """``shifted from 02:30``, ``skipped 02:00 to 02:45``, ``fold: first`` or ``""``."""
        if self.first_moved is None:
            return self.mark
        moved = _span(self.first_moved, self.last_moved)
        return f"skipped {moved}" if self.mark == "skipped" else f"shifted from {moved}"


@dataclass(frozen=True)
class DstEvent:
    """A gap or fold of a cron job's zone that holds matching wall-clock times."""

    kind: Literal["gap", "fold"]
    change_ms: int
    first_wall: datetime
    last_wall: datetime


def preview(schedule: Schedule, after_ms: int, n: int, zone: str = "UTC") -> list[Fire]:
    """The next ``n`` slots of any schedule; a cron job's in its own zone, marked for DST."""
    if isinstance(schedule, Cron):
        return schedule.preview(after_ms, n)
    tz = ZoneInfo(zone)
    out: list[Fire] = []
    slot = schedule.next_after(after_ms)
    while slot is not None and len(out) < n:
        wall = ms_to_datetime(slot).astimezone(tz).replace(tzinfo=None)
        out.append(Fire(slot, wall, zone))
        slot = schedule.next_after(slot)
    return out


def _span(first: datetime, last: datetime | None) -> str:
    text = "%H:%M:%S" if first.second or (last and last.second) else "%H:%M"
    if last is None or last == first:
        return first.strftime(text)
    return f"{first.strftime(text)} to {last.strftime(text)}"


class Cron:
    """A cron expression evaluated on wall-clock time in an IANA time zone.

    Accepted forms: 5 fields (minute hour day month weekday), 6 fields with the
    seconds FIRST (``*/10 * * * * *`` is every 10 seconds), and the aliases
    ``@hourly``, ``@daily``, ``@midnight``, ``@weekly``, ``@monthly``, ``@yearly``,
    ``@annually``. Field syntax (ranges, steps, names, ``L``, ``W``, ``#``) is croniter's;
    day-of-month and weekday combine with OR, as in classic cron.

    The expression is matched against NAIVE local wall-clock times and each match is
    resolved to real instants, because croniter's own time-zone-aware iteration fires a
    fixed-hour expression twice in a repeated hour. The DST rules:

    1. An expression whose hour field matches all 24 hours (``*``, ``*/1``, ``0-23``;
       e.g. ``*/15 * * * *``, ``0 * * * *``, ``@hourly``) keeps real elapsed time, as
       Vixie cron does for wildcard hours: a wall-clock time inside a gap does not fire
       (the clock never shows it, and the times around it are real), and a repeated
       wall-clock time fires at both occurrences. ``dst_gap`` and ``dst_fold`` do not
       apply to it.
    2. Gap (spring forward), any other expression: ``dst_gap="shift"`` (default) fires a
       matching time that does not exist once, at the first instant after the gap (the
       transition instant, whose wall clock is the end of the gap); all matches inside
       one gap, and a match on the gap's end itself, are one slot there. So ``30 2 * * *``
       in New York on 2026-03-08 fires at 03:00 EDT. ``dst_gap="skip"`` does not fire it.
    3. Fold (fall back), any other expression: ``dst_fold="first"`` (default) fires a
       matching time that happens twice at its first occurrence, ``"second"`` at its
       second, ``"both"`` at both. ``30 1 * * *`` in New York on 2026-11-01 fires at
       01:30 EDT, 01:30 EST, or both.
    4. Anywhere else a wall-clock time is exactly one instant.

    An expression with no match in the next 9 years (``0 0 30 2 *``) is refused with
    ``ValueError``, as is an unknown zone or policy, a range that does not run forwards
    (``1-0``, ``5-5``: croniter would read them as "every minute") and croniter's random
    ``R`` (each instance would draw its own slots). UTC-offset changes are assumed to be
    more than 6 hours apart, which holds for every zone in tzdata.
    """

    type: ScheduleType = "cron"

    def __init__(
        self, expression: str, timezone: str, dst_gap: GapPolicy = "shift",
        dst_fold: FoldPolicy = "first",
    ) -> None:
        if not isinstance(expression, str):
            raise ValueError(f"expected a string, got {type(expression).__name__}")
        if dst_gap not in GAP_POLICIES:
            raise ValueError(f"dst_gap must be 'shift' or 'skip', got {dst_gap!r}")
        if dst_fold not in FOLD_POLICIES:
            raise ValueError(f"dst_fold must be 'first', 'second' or 'both', got {dst_fold!r}")
        self.dst_gap: GapPolicy = dst_gap
        self.dst_fold: FoldPolicy = dst_fold
        self.expression = " ".join(expression.split())
        text = self.expression.lower()
        if text.startswith("@"):
            if text not in _ALIASES:
                known = ", ".join(_ALIASES)
                raise ValueError(f"unknown alias {self.expression!r}; use one of {known}")
            text = _ALIASES[text]
        fields = text.split()
        if len(fields) not in (5, 6):
            raise ValueError(
                f"expected 5 fields (minute hour day month weekday), 6 with seconds first, "
                f"or an alias such as @daily; got {len(fields)} field(s)"
            )
        _check_fields(fields)
        if not isinstance(timezone, str) or not timezone:
            raise ValueError(f"unknown time zone {timezone!r}")
        try:
            self.zone = ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError, TypeError, OSError):
            raise ValueError(
                f"unknown time zone {timezone!r}; use an IANA name such as 'Europe/Athens'"
            ) from None
        self.timezone = timezone
        self._seconds = len(fields) == 6
        try:
            self._iter = croniter(
                text, _NAIVE_EPOCH, ret_type=datetime, second_at_beginning=self._seconds
            )
            probe = croniter(
                text, _local_now(self.zone), ret_type=datetime, second_at_beginning=self._seconds,
                max_years_between_matches=_MATCH_YEARS,
            )
        except CroniterError as exc:
            raise ValueError(_croniter_message(exc)) from None
        try:
            probe.get_next(datetime)
        except CroniterError:
            raise ValueError(f"never matches (no time in the next {_MATCH_YEARS} years)") from None
        hours = self._iter.expanded[1]
        self.every_hour = "*" in hours or set(range(24)).issubset(hours)
        # The policies in force: an every-hour expression keeps real elapsed time.
        self._gap: GapPolicy = "skip" if self.every_hour else dst_gap
        self._fold: FoldPolicy = "both" if self.every_hour else dst_fold
        self._lock = threading.Lock()
        self._min_gap: float | None = None

    # wall clock <-> instants -------------------------------------------------------

    def _offset_ms(self, ms: int) -> int:
        local = (_EPOCH + timedelta(milliseconds=ms)).astimezone(self.zone)
        offset = local.utcoffset()
        assert offset is not None
        return offset // _MS

    def _wall(self, ms: int, offset_ms: int) -> datetime:
        return _NAIVE_EPOCH + timedelta(milliseconds=ms + offset_ms)

    def wall_of(self, ms: int) -> datetime:
        """The naive local wall-clock time at instant ``ms``."""
        return self._wall(ms, self._offset_ms(ms))

    def _instant(self, wall: datetime, fold: int) -> int:
        return (wall.replace(tzinfo=self.zone, fold=fold) - _EPOCH) // _MS

    def resolve(self, wall: datetime) -> tuple[int, ...]:
        """The instants (epoch ms) at which a matching naive wall-clock time fires, ascending.

        Empty for a wall-clock time in a gap that is skipped.
        """
        first = self._instant(wall, 0)
        second = self._instant(wall, 1)
        if first == second:
            return (first,)
        if first < second:  # fold: fold=0 is the earlier (pre-transition) reading
            return {"first": (first,), "second": (second,), "both": (first, second)}[self._fold]
        if self._gap == "skip":
            return ()
        return (self._transition(second, first),)  # gap

    def _transition(self, before: int, after: int) -> int:
        """The first instant in (before, after] whose UTC offset differs from ``before``'s."""
        old = self._offset_ms(before)
        lo, hi = before, after
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._offset_ms(mid) == old:
                lo = mid
            else:
                hi = mid
        return hi

    def _gap_of(self, wall: datetime) -> int:
        """The transition instant of the gap that contains ``wall``."""
        return self._transition(self._instant(wall, 1), self._instant(wall, 0))

    def _fall_back_near(self, ms: int) -> tuple[int, int, int] | None:
        """``(instant, old_offset, new_offset)`` of a fall-back within ``_WINDOW_MS`` of ``ms``.

        Offset changes are assumed to be more than ``2 * _WINDOW_MS`` apart (true of tzdata).
        """
        before, after = self._offset_ms(ms - _WINDOW_MS), self._offset_ms(ms + _WINDOW_MS)
        if before <= after:
            return None
        return self._transition(ms - _WINDOW_MS, ms + _WINDOW_MS), before, after

    def _walls_up(self, start: datetime) -> Iterator[datetime]:
        """Matching wall-clock times from ``start``'s whole second on, ascending."""
        self._iter.set_current(start.replace(microsecond=0) - _SECOND, force=True)
        while True:
            try:
                yield self._iter.get_next(datetime)
            except CroniterError:
                return

    def _walls_down(self, start: datetime) -> Iterator[datetime]:
        """Matching wall-clock times up to ``start``'s next whole second, descending."""
        self._iter.set_current(start.replace(microsecond=0) + _SECOND, force=True)
        while True:
            try:
                yield self._iter.get_prev(datetime)
            except CroniterError:
                return

    def _first_primary_after(self, start: datetime, after_ms: int) -> int | None:
        """The first primary instant past ``after_ms`` among walls from ``start`` up."""
        while True:
            for wall in self._walls_up(start):
                instants = self.resolve(wall)
                if not instants:  # a skipped gap: go on from its end, not wall by wall
                    change = self._gap_of(wall)
                    start = self._wall(change, self._offset_ms(change))
                    break
                if instants[0] > after_ms:
                    return instants[0]
            else:
                return None

    def _last_primary_at_or_before(self, start: datetime, ms: int) -> int | None:
        """The last primary instant at or before ``ms`` among walls from ``start`` down."""
        while True:
            for wall in self._walls_down(start):
                instants = self.resolve(wall)
                if not instants:  # a skipped gap: go on from just before its start
                    change = self._gap_of(wall)
                    start = self._wall(change - 1, self._offset_ms(change - 1))
                    break
                if instants[0] <= ms:
                    return instants[0]
            else:
                return None

    # the Schedule protocol ----------------------------------------------------------
    #
    # Every matching wall-clock time that fires has a PRIMARY instant (its only instant,
    # its first occurrence in a fold - its second under dst_fold="second" -, or the end of
    # its gap), non-decreasing in wall-clock order; under dst_fold="both" (and for every-hour
    # expressions) walls in a fold add a SECOND instant. So the answer is the first (last)
    # primary past the bound, or a second occurrence near a fall-back: a couple of croniter
    # steps, never a scan. The walls to start from depend on the fold and gap at hand.

    def next_after(self, after_ms: int) -> int | None:
        first = after_ms + 1
        offset = self._offset_ms(first)
        start = self._wall(first, offset)
        before = self._offset_ms(first - 1)
        if before < offset:  # ``first`` is a spring-forward: its gap's walls resolve to it
            start = min(start, self._wall(first - 1, before))
        fall = self._fall_back_near(first)
        if fall is not None:
            change, old, new = fall
            if self._fold == "second":
                if first <= change:  # fold walls below ``start`` fire later, at their second
                    start = min(start, max(self._wall(first, new), self._wall(change, new)))
            elif change <= first:
                start = max(start, self._wall(change, old))  # past the fold: skip its walls
        with self._lock:
            best = self._first_primary_after(start, after_ms)
            if fall is not None and self._fold == "both":
                change, old, new = fall
                low = self._wall(max(change, first), new)
                for wall in self._walls_up(low):
                    if wall >= self._wall(change, old):
                        break  # out of the fold
                    second = self._instant(wall, 1)
                    if wall >= low and second > after_ms:
                        if best is None or second < best:
                            best = second
                        break
        return best

    def latest_at_or_before(self, ms: int) -> int | None:
        fall = self._fall_back_near(ms)
        start = self._wall(ms, self._offset_ms(ms))
        if fall is not None:
            change, old, new = fall
            if self._fold == "second":
                if ms < change:  # every fold wall fires later, at its second occurrence
                    start = min(start, self._wall(change, new) - _MS)
            elif change <= ms:
                start = max(start, self._wall(change - 1, old))  # every fold wall is past
        with self._lock:
            best = self._last_primary_at_or_before(start, ms)
            if self._fold == "both" and best is not None:
                # A second occurrence lies within a fold's width (< _WINDOW_MS) after the
                # first one, itself at or before ``best``: near ``ms`` or near ``best``.
                near = {f for f in (fall, self._fall_back_near(best)) if f is not None}
                for change, old, new in near:
                    if change <= ms:
                        second = self._last_second(change, old, new, ms)
                        if second is not None and second > best:
                            best = second
        return best

    def _last_second(self, change: int, old: int, new: int, ms: int) -> int | None:
        """The last second occurrence at or before ``ms`` of a wall in the fold at ``change``."""
        high = self._wall(min(ms, change + old - new - 1), new)
        for wall in self._walls_down(high):
            if wall < self._wall(change, new):
                return None  # before the fold
            second = self._instant(wall, 1)
            if wall <= high and second <= ms:
                return second
        return None

    def min_gap_ms(self) -> float:
        """Smallest real gap between consecutive slots over roughly the coming year (cached).

        Scans the next year of slots (at most ``_GAP_SLOTS`` of them) and, separately, the
        slots around every UTC-offset change in that year, where DST can shorten a gap.
        """
        if self._min_gap is None:
            self._min_gap = self.min_gap_from(int(time.time() * 1000))
        return self._min_gap

    def min_gap_from(self, start_ms: int, horizon_ms: int = _YEAR_MS) -> float:
        """:meth:`min_gap_ms` measured from ``start_ms`` rather than now (for tests)."""
        slots: list[int] = []
        cursor: int | None = start_ms
        while cursor is not None and len(slots) < _GAP_SLOTS:
            cursor = self.next_after(cursor)
            if cursor is None or (cursor > start_ms + horizon_ms and len(slots) >= 3):
                break
            slots.append(cursor)
        best = min((b - a for a, b in itertools.pairwise(slots)), default=math.inf)
        for change in self._offset_changes(start_ms, start_ms + horizon_ms):
            best = min(best, self._min_gap_near(change))
        return best

    def _offset_changes(self, start_ms: int, end_ms: int) -> list[int]:
        changes = []
        previous, offset = start_ms, self._offset_ms(start_ms)
        for probe in range(start_ms + _DAY_MS, end_ms + _DAY_MS, _DAY_MS):
            now = self._offset_ms(probe)
            if now != offset:
                changes.append(self._transition(previous, probe))
            previous, offset = probe, now
        return changes

    def _min_gap_near(self, change_ms: int) -> float:
        first = change_ms - 1
        for _ in range(4):
            earlier = self.latest_at_or_before(first - 1)
            if earlier is None:
                break
            first = earlier
        slots = [first]
        while len(slots) < 64:
            following = self.next_after(slots[-1])
            if following is None:
                break
            slots.append(following)
            if following > change_ms + _WINDOW_MS and len(slots) > 8:
                break
        return min((b - a for a, b in itertools.pairwise(slots)), default=math.inf)

    # previews and DST events: what the rules do to this expression -----------------

    def preview(self, after_ms: int, n: int) -> list[Fire]:
        """The next ``n`` slots after ``after_ms``, each marked when a DST rule shaped it.

        Matching wall-clock times that a gap swallowed (``dst_gap="skip"``, or an every-hour
        expression) come as extra ``skipped`` entries, in order, not counted in ``n``.
        """
        out: list[Fire] = []
        cursor = after_ms
        for _ in range(n):
            slot = self.next_after(cursor)
            if slot is None:
                break
            if self._gap == "skip":
                for change in self._changes_between(cursor, slot, gaps=True):
                    walls = self._matches_between(*self._gap_walls(change))
                    if walls is not None:
                        out.append(Fire(None, walls[0], self.timezone, "skipped", *walls))
            out.append(self._marked(slot))
            cursor = slot
        return out

    def _marked(self, slot: int) -> Fire:
        wall = self.wall_of(slot)
        if self._gap == "shift" and self._offset_ms(slot - 1) < self._offset_ms(slot):
            walls = self._matches_between(*self._gap_walls(slot))
            if walls is not None:
                return Fire(slot, wall, self.timezone, "shifted", *walls)
        first, second = self._instant(wall, 0), self._instant(wall, 1)
        if first < second:
            return Fire(slot, wall, self.timezone, "fold: first" if slot == first else "fold: second")
        return Fire(slot, wall, self.timezone)

    def dst_events(self, start_ms: int, end_ms: int) -> list[DstEvent]:
        """The gaps and folds in [start_ms, end_ms] that hold a matching wall-clock time.

        Empty for an every-hour expression: it keeps real elapsed time, no policy applies.
        """
        if self.every_hour:
            return []
        events = []
        for change in self._offset_changes(start_ms, end_ms):
            old, new = self._offset_ms(change - 1), self._offset_ms(change)
            if old < new:
                walls = self._matches_between(*self._gap_walls(change))
                kind: Literal["gap", "fold"] = "gap"
            else:
                walls = self._matches_between(self._wall(change, new), self._wall(change, old))
                kind = "fold"
            if walls is not None:
                events.append(DstEvent(kind, change, walls[0], walls[1]))
        return events

    def gap_skips(self, after_ms: int, until_ms: int) -> list[int]:
        """The transitions in ``(after_ms, until_ms]`` whose gap swallowed matching wall-clock
        times (``dst_gap="skip"``, or an every-hour expression, as ``preview`` shows them);
        the ledger marks each as skipped, reason ``dst``.

        A transition at which a slot fires is left out: an every-hour expression in a zone
        that moves by whole hours runs right on (01:00 then 03:00 is an hour of elapsed
        time), and that slot's own entry is the one the ledger keeps."""
        if self._gap != "skip":
            return []
        return [
            change for change in self._changes_between(after_ms, until_ms, gaps=True)
            if self._matches_between(*self._gap_walls(change)) is not None
            and self.latest_at_or_before(change) != change
        ]

    def _gap_walls(self, change: int) -> tuple[datetime, datetime]:
        """``[start, end)`` of the wall-clock times skipped by the spring-forward at ``change``."""
        return self._wall(change - 1, self._offset_ms(change - 1)) + _MS, self.wall_of(change)

    def _matches_between(self, low: datetime, high: datetime) -> tuple[datetime, datetime] | None:
        """The first and last matching wall-clock times in ``[low, high)``, or ``None``."""
        with self._lock:
            first = next(self._walls_up(low), None)
            if first is None or first >= high:
                return None
            last = next(self._walls_down(high - _SECOND), first)
        return first, max(first, last)

    def _changes_between(self, after_ms: int, until_ms: int, *, gaps: bool) -> list[int]:
        """UTC-offset changes in ``(after_ms, until_ms]`` (spring-forwards only with ``gaps``)."""
        changes = []
        probes = [*range(after_ms, until_ms, _WINDOW_MS * 2), until_ms]
        for before, after in itertools.pairwise(probes):
            old, new = self._offset_ms(before), self._offset_ms(after)
            if old != new and (new > old or not gaps):
                changes.append(self._transition(before, after))
        return changes

    def describe(self) -> str:
        extra = "".join(
            f", {name}={value}" for name, value, default in
            (("dst_gap", self.dst_gap, "shift"), ("dst_fold", self.dst_fold, "first"))
            if value != default
        )
        return f'cron "{self.expression}" ({self.timezone}{extra})'

    def __repr__(self) -> str:
        return (f"Cron({self.expression!r}, {self.timezone!r}, dst_gap={self.dst_gap!r}, "
                f"dst_fold={self.dst_fold!r})")


def _check_fields(fields: list[str]) -> None:
    """Refuse what croniter accepts but reads otherwise than it is written.

    croniter wraps a backwards range (``1-0`` in the minute field is every minute,
    ``22-2`` in the hour field is 22:00 to 02:00), reads a one-value range ``5-5`` as
    ``*``, and draws ``R`` at random, so instances would disagree on the slots.
    """
    names = (("second",) if len(fields) == 6 else ()) + _FIELDS
    for field_name, text in zip(names, fields, strict=True):
        for part in text.split(","):
            bounds = part.split("/")[0]
            if bounds == "r" or bounds.startswith("r("):
                raise ValueError(
                    f"{field_name} field {text!r}: 'R' (a random value) is refused, since every "
                    "instance would pick its own; write the value"
                )
            ends = bounds.split("-")
            if len(ends) != 2:
                continue
            low, high = (_field_value(field_name, end) for end in ends)
            if low is None or high is None:
                continue
            if low > high:
                raise ValueError(
                    f"{field_name} field {text!r}: the range {bounds!r} runs backwards; write it "
                    f"from the smaller value, or as two ranges separated by a comma"
                )
            if low == high:
                raise ValueError(
                    f"{field_name} field {text!r}: the range {bounds!r} has one value; "
                    f"write {ends[0]!r}"
                )


def _field_value(field_name: str, text: str) -> int | None:
    """A range end as a number (names of months and weekdays included); ``None`` for others."""
    if text.isdigit():
        return int(text)
    return _NAMES.get(field_name, {}).get(text)


def _local_now(zone: ZoneInfo) -> datetime:
    return datetime.now(zone).replace(tzinfo=None)


def _croniter_message(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__

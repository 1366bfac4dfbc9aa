"""Cron DST policies against an oracle built on zoneinfo alone (no cron library).

For each UTC-offset change from 2020 to 2030 in a dozen zones, the oracle enumerates the
real minutes of about a day around it, reads each one's wall clock, matches the wall
minutes against the cron fields with the tiny matcher below, and derives the UTC instants
each policy must fire at. ``next_after`` (iterated, and from probe instants) and
``latest_at_or_before`` must give exactly those.

The default run takes the transitions of 2026 (a zone without any, its last one);
``ANARCHON_DST_FULL=1`` runs every transition of the decade (a few minutes).
"""

from __future__ import annotations

import bisect
import functools
import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from django_anarchon.schedules import FOLD_POLICIES, GAP_POLICIES, Cron

MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR
#: Half the enumerated window, and the edge trimmed off it (where a fold's other half or a
#: gap's end could lie outside the enumeration).
HALF_WINDOW, EDGE = 14 * HOUR, 3 * HOUR
FULL = bool(os.environ.get("ANARCHON_DST_FULL"))

ZONES = [
    "Australia/Lord_Howe",  # 30-minute shift, at 02:00
    "Pacific/Chatham",  # UTC+12:45/+13:45, at 02:45 / 03:45
    "Asia/Tehran",  # at midnight, until 2022
    "Africa/Casablanca",  # backwards during Ramadan
    "America/Santiago",  # at midnight (24:00 -> 23:00, 24:00 -> 01:00)
    "America/Sao_Paulo",  # no DST since 2019: nothing may change
    "America/Havana",  # at midnight (00:00 -> 01:00, 01:00 -> 00:00)
    "Europe/Athens",
    "America/New_York",
    "Europe/London",
    "Australia/Sydney",
    "Pacific/Auckland",
    "America/Asuncion",  # moved to permanent -03 in 2024
    "Asia/Gaza",  # transitions that tzdata moves around Ramadan
]

SHAPES = [
    "30 2 * * *",  # daily at a typical gap time
    "30 1 * * *",  # daily at a typical fold time
    "0 0 * * *",  # midnight (Havana, Santiago, Tehran transitions happen at midnight)
    "30 23 * * *",  # in Santiago's 23:00-24:00 fold
    "0 * * * *",  # hourly: keeps real elapsed time
    "*/15 * * * *",  # every quarter hour: keeps real elapsed time
    "0 1-3 * * *",
    "45 1 * * 0",  # Sundays, when many transitions happen
    "0 0 1 * *",
    "15 2 * * 1-5",  # weekday range
    "0,30 2,3 * * *",  # several matches in one gap
    "*/20 0-4 * * 6,0",  # weekends, several hours
    "45 2 * * *",  # Chatham's gap starts at 02:45
    "10 0-2 * * *",
]
POLICIES = [(gap, fold) for gap in GAP_POLICIES for fold in FOLD_POLICIES]


# -- a tiny cron matcher ----------------------------------------------------------------

@dataclass(frozen=True)
class Fields:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    day_star: bool
    weekday_star: bool

    def match(self, wall: datetime) -> bool:
        if wall.minute not in self.minutes or wall.hour not in self.hours:
            return False
        if wall.month not in self.months:
            return False
        day = wall.day in self.days
        weekday = (wall.isoweekday() % 7) in self.weekdays
        if self.day_star or self.weekday_star:  # classic cron: OR only when both are set
            return day and weekday
        return day or weekday


def _field(text: str, low: int, high: int) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        base, _, step = part.partition("/")
        if base == "*":
            start, end = low, high
        elif "-" in base:
            start, end = (int(x) for x in base.split("-"))
        else:
            start = end = int(base)
        values.update(range(start, end + 1, int(step) if step else 1))
    return frozenset(values)


def parse(expression: str) -> Fields:
    minute, hour, day, month, weekday = expression.split()
    return Fields(_field(minute, 0, 59), _field(hour, 0, 23), _field(day, 1, 31),
                  _field(month, 1, 12), frozenset(v % 7 for v in _field(weekday, 0, 7)),
                  day == "*", weekday == "*")


# -- the oracle ---------------------------------------------------------------------------

def offset_ms(zone: ZoneInfo, ms: int) -> int:
    offset = datetime.fromtimestamp(ms / 1000, UTC).astimezone(zone).utcoffset()
    assert offset is not None
    return int(offset.total_seconds() * 1000)


@functools.cache
def transitions(name: str) -> tuple[int, ...]:
    """Every UTC-offset change from 2020 to 2030 (daily probes, then bisection)."""
    zone = ZoneInfo(name)
    start = int(datetime(2020, 1, 1, tzinfo=UTC).timestamp() * 1000)
    end = int(datetime(2031, 1, 1, tzinfo=UTC).timestamp() * 1000)
    found = []
    previous = offset_ms(zone, start)
    for probe in range(start + DAY, end, DAY):
        now = offset_ms(zone, probe)
        if now != previous:
            lo, hi = probe - DAY, probe
            while hi - lo > MINUTE:  # offsets change on whole minutes
                mid = (lo + hi) // 2 // MINUTE * MINUTE
                if offset_ms(zone, mid) == previous:
                    lo = mid
                else:
                    hi = mid
            found.append(hi)
        previous = now
    return tuple(found)


@functools.cache
def occurrences(name: str, change: int) -> dict[datetime, tuple[int, ...]]:
    """Each wall minute around ``change`` and the real minutes that show it."""
    zone = ZoneInfo(name)
    seen: dict[datetime, list[int]] = {}
    for minute in range(change - HALF_WINDOW, change + HALF_WINDOW, MINUTE):
        wall = datetime.fromtimestamp(minute / 1000, UTC).astimezone(zone).replace(tzinfo=None)
        seen.setdefault(wall, []).append(minute)
    return {wall: tuple(found) for wall, found in seen.items()}


@functools.cache
def matches(name: str, change: int, expression: str) -> tuple[tuple[int, ...], ...]:
    """For each matching wall minute around ``change``, in order: the real minutes showing
    it (none in a gap, two in a fold), or, in a gap, ``(-m,)`` where m is the first real
    minute whose wall clock is later."""
    fields = parse(expression)
    seen = occurrences(name, change)
    walls = sorted(seen)
    found: list[tuple[int, ...]] = []
    wall = walls[0]
    while wall <= walls[-1]:
        if fields.match(wall):
            real = seen.get(wall)
            if real is None:
                later = min(m for w, ms_ in seen.items() if w > wall for m in ms_)
                found.append((-later,))
            else:
                found.append(real)
        wall += timedelta(minutes=1)
    return tuple(found)


def expected(name: str, change: int, expression: str, gap: str, fold: str) -> list[int]:
    if len(parse(expression).hours) == 24:  # keeps real elapsed time whatever the policies
        gap, fold = "skip", "both"
    fired: set[int] = set()
    for real in matches(name, change, expression):
        if real[0] < 0:  # in a gap
            if gap == "shift":
                fired.add(-real[0])
        elif len(real) == 1:
            fired.add(real[0])
        else:
            fired.update({"first": real[:1], "second": real[1:], "both": real}[fold])
    low, high = change - HALF_WINDOW + EDGE, change + HALF_WINDOW - EDGE
    return sorted(s for s in fired if low <= s < high)


# -- the cases ------------------------------------------------------------------------------

def _cases() -> list[tuple[str, int]]:
    """Every transition with ANARCHON_DST_FULL; else those of 2026, or a zone's last one."""
    cases = []
    for name in ZONES:
        changes = transitions(name)
        chosen = [c for c in changes if FULL or datetime.fromtimestamp(c / 1000, UTC).year == 2026]
        cases.extend((name, change) for change in chosen or changes[-1:])
    return cases


CASES = _cases()


def _label(case: tuple[str, int]) -> str:
    name, change = case
    return f"{name}@{datetime.fromtimestamp(change / 1000, UTC):%Y-%m-%dT%H:%MZ}"


def local(name: str, ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, ZoneInfo(name)).isoformat()


def test_the_oracle_sees_the_transitions() -> None:
    assert transitions("America/Sao_Paulo") == ()  # no DST since 2019
    assert len(transitions("America/New_York")) == 22
    assert len(transitions("Asia/Tehran")) == 6  # 2020 to 2022, then abolished
    assert len(CASES) >= (250 if FULL else 24)
    # a gap that does not start on the hour, and a fold at midnight
    chatham = occurrences("Pacific/Chatham", transitions("Pacific/Chatham")[1])
    assert datetime(2020, 9, 27, 3, 0) not in chatham
    havana = occurrences("America/Havana", transitions("America/Havana")[1])
    assert len(havana[datetime(2020, 11, 1, 0, 30)]) == 2


@pytest.mark.parametrize("case", CASES, ids=_label)
def test_cron_matches_the_oracle(case: tuple[str, int]) -> None:
    name, change = case
    low, high = change - HALF_WINDOW + EDGE, change + HALF_WINDOW - EDGE
    probes = list(range(low, high, (41 if FULL else 97) * MINUTE))
    for expression in SHAPES:
        probed: set[tuple[int, ...]] = set()
        for gap, fold in POLICIES:
            want = expected(name, change, expression, gap, fold)
            # Iterate under every policy; probe each distinct answer once (a gap's answer
            # does not depend on dst_fold, nor a fold's on dst_gap, nor an every-hour one's
            # on either), to stay fast.
            probing = tuple(want) not in probed
            probed.add(tuple(want))
            cron = Cron(expression, name, dst_gap=gap, dst_fold=fold)  # type: ignore[arg-type]
            label = f"{expression!r} {gap}/{fold} {_label(case)}"
            got = []
            cursor = cron.next_after(low - 1)
            while cursor is not None and cursor < high:
                got.append(cursor)
                cursor = cron.next_after(cursor)
            assert [local(name, s) for s in got] == [local(name, s) for s in want], label
            points = probes + [p for s in want for p in (s - 1, s)] if probing else []
            for point in points:
                at = bisect.bisect_right(want, point)
                if at < len(want):
                    assert cron.next_after(point) == want[at], (label, local(name, point))
                if at > 0:
                    assert cron.latest_at_or_before(point) == want[at - 1], (label, local(name, point))

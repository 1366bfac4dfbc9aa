"""Schedules on fixed dates: cron DST rules, aliases, seconds, min gap; Every and Once.

Every instant is written with its UTC offset, so a test says exactly which occurrence of
a repeated wall-clock time it means. Transitions used (2026):

- Europe/Athens: 03-29 03:00 -> 04:00 (gap), 10-25 04:00 -> 03:00 (fold)
- America/New_York: 03-08 02:00 -> 03:00 (gap), 11-01 02:00 -> 01:00 (fold)
- Australia/Lord_Howe: 10-04 02:00 -> 02:30 (gap), 04-05 02:00 -> 01:30 (fold)
"""

from __future__ import annotations

import itertools
import math
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter

from django_anarchon.exceptions import ConfigurationError
from django_anarchon.jobs import make_cron
from django_anarchon.schedules import Cron, Every, Once

MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR

ATHENS, NEW_YORK, LORD_HOWE = "Europe/Athens", "America/New_York", "Australia/Lord_Howe"


def ms(text: str) -> int:
    """An ISO instant with an explicit offset, as epoch milliseconds."""
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def local(instant: int, zone: str) -> str:
    return datetime.fromtimestamp(instant / 1000, ZoneInfo(zone)).isoformat()


def slots(cron: Cron, after: int, count: int) -> list[int]:
    out: list[int] = []
    for _ in range(count):
        nxt = cron.next_after(out[-1] if out else after)
        assert nxt is not None
        out.append(nxt)
    return out


# -- the DST rules, one zone at a time ------------------------------------------------

GAP_CASES = [
    # zone, expression matching only inside the gap, the day before, fire, the day after
    (NEW_YORK, "30 2 * * *", "2026-03-07T02:30-05:00", "2026-03-08T03:00-04:00",
     "2026-03-09T02:30-04:00"),
    (ATHENS, "30 3 * * *", "2026-03-28T03:30+02:00", "2026-03-29T04:00+03:00",
     "2026-03-30T03:30+03:00"),
    (LORD_HOWE, "15 2 * * *", "2026-10-03T02:15+10:30", "2026-10-04T02:30+11:00",
     "2026-10-05T02:15+11:00"),
]


@pytest.mark.parametrize(("zone", "expression", "day_before", "fire", "next_day"), GAP_CASES)
def test_gap_fires_once_at_first_instant_after_it(
    zone: str, expression: str, day_before: str, fire: str, next_day: str
) -> None:
    cron = Cron(expression, zone)
    assert slots(cron, ms(day_before), 2) == [ms(fire), ms(next_day)]
    assert cron.latest_at_or_before(ms(fire)) == ms(fire)
    assert cron.latest_at_or_before(ms(fire) - 1) == ms(day_before)


@pytest.mark.parametrize(
    ("zone", "expression", "before", "fire"),
    [
        # two matches in the gap and one on its end: one slot
        (NEW_YORK, "0,30 2,3 * * *", "2026-03-08T01:00-05:00",
         ["2026-03-08T03:00-04:00", "2026-03-08T03:30-04:00", "2026-03-09T02:00-04:00"]),
        (ATHENS, "*/20 3 * * *", "2026-03-29T02:00+02:00",
         ["2026-03-29T04:00+03:00", "2026-03-30T03:00+03:00"]),
        (LORD_HOWE, "0,10,20 2 * * *", "2026-10-04T01:00+10:30",
         ["2026-10-04T02:30+11:00", "2026-10-05T02:00+11:00"]),
    ],
)
def test_matches_in_a_gap_collapse_into_one_slot(
    zone: str, expression: str, before: str, fire: list[str]
) -> None:
    cron = Cron(expression, zone)
    assert slots(cron, ms(before), len(fire)) == [ms(text) for text in fire]


FOLD_CASES = [
    # zone, expression matching only inside the repeated period, before, first occurrence,
    # the next day's slot
    (NEW_YORK, "30 1 * * *", "2026-11-01T00:00-04:00", "2026-11-01T01:30-04:00",
     "2026-11-02T01:30-05:00"),
    (ATHENS, "30 3 * * *", "2026-10-25T00:00+03:00", "2026-10-25T03:30+03:00",
     "2026-10-26T03:30+02:00"),
    (LORD_HOWE, "45 1 * * *", "2026-04-05T00:00+11:00", "2026-04-05T01:45+11:00",
     "2026-04-06T01:45+10:30"),
]


@pytest.mark.parametrize(("zone", "expression", "before", "first", "next_day"), FOLD_CASES)
def test_fold_fires_once_at_first_occurrence(
    zone: str, expression: str, before: str, first: str, next_day: str
) -> None:
    cron = Cron(expression, zone)
    assert slots(cron, ms(before), 2) == [ms(first), ms(next_day)]
    # From inside the second occurrence, the next slot is tomorrow's and the latest is the first.
    shift = 30 * MINUTE if zone == LORD_HOWE else HOUR
    second = ms(first) + shift
    assert cron.next_after(second - 1) == ms(next_day)
    assert cron.latest_at_or_before(second) == ms(first)


@pytest.mark.parametrize(
    ("zone", "around"),
    [
        (NEW_YORK, "2026-03-08T02:00-05:00"),
        (NEW_YORK, "2026-11-01T02:00-04:00"),
        (ATHENS, "2026-03-29T03:00+02:00"),
        (ATHENS, "2026-10-25T04:00+03:00"),
        (LORD_HOWE, "2026-10-04T02:00+10:30"),
        (LORD_HOWE, "2026-04-05T02:00+11:00"),
    ],
)
def test_every_15_minutes_keeps_real_time(zone: str, around: str) -> None:
    cron = Cron("*/15 * * * *", zone)
    start = ms(around) - 3 * HOUR
    fired = slots(cron, start, 6 * 4 + 4)
    assert {b - a for a, b in itertools.pairwise(fired)} == {15 * MINUTE}
    assert fired[-1] > ms(around) + 2 * HOUR
    # and backwards: every slot is its own latest, the instant before gives the previous
    for previous, slot in itertools.pairwise(fired):
        assert cron.latest_at_or_before(slot) == slot
        assert cron.latest_at_or_before(slot - 1) == previous


@pytest.mark.parametrize(
    ("zone", "around"),
    [(NEW_YORK, "2026-11-01T02:00-04:00"), (ATHENS, "2026-10-25T04:00+03:00"),
     (NEW_YORK, "2026-03-08T02:00-05:00"), (ATHENS, "2026-03-29T03:00+02:00")],
)
def test_hourly_keeps_real_hours_across_whole_hour_shifts(zone: str, around: str) -> None:
    fired = slots(Cron("@hourly", zone), ms(around) - 4 * HOUR, 9)
    assert {b - a for a, b in itertools.pairwise(fired)} == {HOUR}


def test_every_second_through_a_fold() -> None:
    cron = Cron("* * * * * *", NEW_YORK)
    fall_back = ms("2026-11-01T02:00-04:00")
    fired = slots(cron, fall_back - 5 * MINUTE, 10 * 60)
    assert {b - a for a, b in itertools.pairwise(fired)} == {1_000}


def test_hour_field_decides_the_second_occurrence() -> None:
    every_hour = Cron("30 * * * *", NEW_YORK)
    some_hours = Cron("30 0-12 * * *", NEW_YORK)
    assert every_hour.every_hour and not some_hours.every_hour
    assert Cron("30 0-23 * * *", NEW_YORK).every_hour
    assert Cron("30 */1 * * *", NEW_YORK).every_hour
    start = ms("2026-11-01T00:00-04:00")
    assert [local(s, NEW_YORK) for s in slots(every_hour, start, 3)] == [
        "2026-11-01T00:30:00-04:00", "2026-11-01T01:30:00-04:00", "2026-11-01T01:30:00-05:00"]
    assert [local(s, NEW_YORK) for s in slots(some_hours, start, 3)] == [
        "2026-11-01T00:30:00-04:00", "2026-11-01T01:30:00-04:00", "2026-11-01T02:30:00-05:00"]


# -- brute force: every real minute around each transition ----------------------------

TRANSITIONS = [
    (NEW_YORK, "2026-03-08T02:00-05:00"),
    (NEW_YORK, "2026-11-01T02:00-04:00"),
    (ATHENS, "2026-03-29T03:00+02:00"),
    (ATHENS, "2026-10-25T04:00+03:00"),
    (LORD_HOWE, "2026-10-04T02:00+10:30"),
    (LORD_HOWE, "2026-04-05T02:00+11:00"),
]
ENUMERATED = [
    ("*/15 * * * *", True),
    ("7 * * * *", True),
    ("30 1-3 * * *", False),
    ("15,45 2-4 * * *", False),
    ("0 0-5/2 * * *", False),
]


def expected_slots(expression: str, every_hour: bool, zone: str, start: int, end: int) -> list[int]:
    """The default rules applied by hand to every real minute in [start, end) and wall minute."""
    tz = ZoneInfo(zone)
    occurrences: dict[datetime, list[int]] = {}
    for minute in range(start, end, MINUTE):
        wall = datetime.fromtimestamp(minute / 1000, tz).replace(tzinfo=None)
        occurrences.setdefault(wall, []).append(minute)
    walls = sorted(occurrences)
    fired: set[int] = set()
    wall = walls[0]
    while wall <= walls[-1]:
        if croniter.match(expression, wall):
            seen = occurrences.get(wall)
            if seen is not None:
                fired.update(seen if every_hour else seen[:1])
            elif not every_hour:  # in a gap: the first real minute after it (an every-hour
                # expression keeps real time instead: nothing fires in the gap)
                fired.add(min(m for w, ms_ in occurrences.items() if w > wall for m in ms_))
        wall += timedelta(minutes=1)
    return sorted(fired)


@pytest.mark.parametrize(("zone", "around"), TRANSITIONS)
@pytest.mark.parametrize(("expression", "every_hour"), ENUMERATED)
def test_matches_brute_force_enumeration(
    zone: str, around: str, expression: str, every_hour: bool
) -> None:
    start, end = ms(around) - 8 * HOUR, ms(around) + 8 * HOUR
    cron = Cron(expression, zone)
    assert cron.every_hour is every_hour
    # Trim the edges, where the enumeration cannot see a fold's other half.
    expected = [s for s in expected_slots(expression, every_hour, zone, start, end)
                if start + 3 * HOUR <= s < end - 3 * HOUR]
    assert expected, "the window must contain slots"
    got: list[int] = []
    cursor = start + 3 * HOUR - 1
    while True:
        nxt = cron.next_after(cursor)
        assert nxt is not None
        if nxt >= end - 3 * HOUR:
            break
        got.append(nxt)
        cursor = nxt
    assert [local(s, zone) for s in got] == [local(s, zone) for s in expected]
    # Every real minute in the window, both directions.
    for minute in range(start + 3 * HOUR, end - 4 * HOUR, MINUTE):
        later = [s for s in expected if s > minute]
        earlier = [s for s in expected if s <= minute]
        if later:
            assert cron.next_after(minute) == later[0], local(minute, zone)
        if earlier:
            assert cron.latest_at_or_before(minute) == earlier[-1], local(minute, zone)


# -- forms, aliases, seconds ------------------------------------------------------------

def test_six_fields_have_seconds_first() -> None:
    start = ms("2026-06-01T12:00:00+00:00")
    assert slots(Cron("*/10 * * * * *", "UTC"), start, 3) == [start + 10_000, start + 20_000,
                                                             start + 30_000]
    # second 30 of minute 0 of hour 12, every day
    noon = Cron("30 0 12 * * *", "UTC")
    assert noon.next_after(start) == start + 30_000
    assert noon.next_after(start + 30_000) == start + DAY + 30_000
    assert noon.latest_at_or_before(start + 29_999) == start - DAY + 30_000
    assert Cron("*/10 * * * * *", "UTC").min_gap_ms() == 10_000


@pytest.mark.parametrize(
    ("alias", "after", "expected"),
    [
        ("@hourly", "2026-06-01T12:10+00:00", "2026-06-01T13:00+00:00"),
        ("@daily", "2026-06-01T12:10+00:00", "2026-06-02T00:00+00:00"),
        ("@midnight", "2026-06-01T12:10+00:00", "2026-06-02T00:00+00:00"),
        ("@weekly", "2026-06-01T12:10+00:00", "2026-06-07T00:00+00:00"),  # Sunday
        ("@monthly", "2026-06-01T12:10+00:00", "2026-07-01T00:00+00:00"),
        ("@yearly", "2026-06-01T12:10+00:00", "2027-01-01T00:00+00:00"),
        ("@annually", "2026-06-01T12:10+00:00", "2027-01-01T00:00+00:00"),
        ("@DAILY", "2026-06-01T12:10+00:00", "2026-06-02T00:00+00:00"),
    ],
)
def test_aliases(alias: str, after: str, expected: str) -> None:
    assert Cron(alias, "UTC").next_after(ms(after)) == ms(expected)


def test_evaluated_in_the_zone() -> None:
    cron = Cron("0 8 * * 1-5", ATHENS)
    # Friday 2026-06-05 09:00 Athens -> Monday 08:00 Athens (UTC+3)
    assert cron.next_after(ms("2026-06-05T09:00+03:00")) == ms("2026-06-08T08:00+03:00")
    assert cron.describe() == 'cron "0 8 * * 1-5" (Europe/Athens)'
    assert Cron("  0   8 * *  1-5 ", ATHENS).describe() == 'cron "0 8 * * 1-5" (Europe/Athens)'


def test_latest_at_or_before_agrees_with_next_after() -> None:
    for expression, zone in [("0 8 * * 1-5", ATHENS), ("*/7 * * * *", NEW_YORK),
                             ("0 0 L * *", LORD_HOWE), ("15 */3 * * *", "UTC")]:
        cron = Cron(expression, zone)
        t = ms("2026-01-01T00:00+00:00")
        for _ in range(200):
            nxt = cron.next_after(t)
            assert nxt is not None and nxt > t
            assert cron.latest_at_or_before(nxt) == nxt
            latest = cron.latest_at_or_before(nxt - 1)
            assert latest is not None and latest <= t
            t += 3 * HOUR + 17 * MINUTE


def test_leap_day_is_accepted() -> None:
    cron = Cron("0 0 29 2 *", "UTC")
    assert cron.next_after(ms("2026-01-01T00:00+00:00")) == ms("2028-02-29T00:00+00:00")


@pytest.mark.parametrize(
    "expression",
    ["", "* * *", "61 * * * *", "* 24 * * *", "* * * * * * *", "@fortnightly", "not a cron",
     "0 0 30 2 *", "0 0 31 4 *", "* * * * mo"],
)
def test_bad_expressions_raise_value_error(expression: str) -> None:
    with pytest.raises(ValueError) as info:
        Cron(expression, "UTC")
    assert str(info.value)  # readable, non-empty


@pytest.mark.parametrize(
    ("expression", "field", "fragment"),
    [
        ("1-0 * * * *", "minute", "runs backwards"),  # croniter: every minute
        ("1-0/5 * * * *", "minute", "runs backwards"),  # croniter: 1-59/5
        ("0,59-0 * * * *", "minute", "runs backwards"),  # croniter: 0 and 59
        ("0 22-2 * * *", "hour", "runs backwards"),  # croniter: 22:00 to 02:00
        ("0 0 20-10 * *", "day of month", "runs backwards"),
        ("0 0 1 dec-jan *", "month", "runs backwards"),
        ("0 0 * * 7-1", "weekday", "runs backwards"),
        ("0 0 * * sat-sun", "weekday", "runs backwards"),
        ("*/10 5-1 * * * *", "minute", "runs backwards"),  # six fields: seconds first
        ("5-1 * * * * *", "second", "runs backwards"),
        ("5-5 * * * *", "minute", "one value"),  # croniter: every minute
        ("1-1/2 * * * *", "minute", "one value"),  # croniter: every even minute
        ("0 0 * * mon-mon", "weekday", "one value"),  # croniter: every day
        ("R * * * *", "minute", "random"),  # croniter: a random minute per process
        ("0 R * * *", "hour", "random"),
    ],
)
def test_expressions_croniter_misreads_are_refused(expression: str, field: str,
                                                   fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        Cron(expression, "UTC")
    assert str(info.value).startswith(f"{field} field")
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("expression", "first"),
    [
        ("0-1 * * * *", "2026-01-01T00:01"),
        ("58-59,0 * * * *", "2026-01-01T00:58"),
        ("0 9-17/4 * * *", "2026-01-01T09:00"),
        ("0 0 * * 0-7", "2026-01-02T00:00"),
        ("0 0 * * 5-7", "2026-01-02T00:00"),  # Friday to Sunday (7 is Sunday)
        ("0 0 * jan-feb *", "2026-01-02T00:00"),
        ("0 0 L * *", "2026-01-31T00:00"),
    ],
)
def test_forward_ranges_are_taken(expression: str, first: str) -> None:
    cron = Cron(expression, "UTC")
    assert cron.next_after(ms("2026-01-01T00:00:30+00:00")) == ms(f"{first}+00:00")


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "", "../etc/passwd", "europe athens"])
def test_unknown_zone_raises_value_error(zone: str) -> None:
    with pytest.raises(ValueError, match="time zone"):
        Cron("0 8 * * *", zone)


def test_make_cron_names_job_option_and_value() -> None:
    with pytest.raises(ConfigurationError) as info:
        make_cron("report", "0 0 30 2 *", "UTC")
    assert (info.value.job, info.value.option, info.value.value) == (
        "report", "expression", "0 0 30 2 *")
    assert "never matches" in str(info.value) and "'report'" in str(info.value)


@pytest.mark.parametrize(
    ("expression", "zone", "gap"),
    [
        ("*/10 * * * * *", "UTC", 10_000),
        ("*/15 * * * *", LORD_HOWE, 15 * MINUTE),
        ("0 8 * * 1-5", ATHENS, DAY),
        ("0 9 * * *", NEW_YORK, 23 * HOUR),  # the spring-forward day is 23 hours long
        ("0 9 * * *", "UTC", DAY),
        ("59 * * * *", NEW_YORK, HOUR),  # 01:59 EST, then 03:59 EDT: 02:59 (gap) does not fire
        ("59 1,2 * * *", NEW_YORK, MINUTE),  # 01:59 EST, then 02:59 (gap) fires at 03:00 EDT
        ("0 0,23 * * *", "UTC", HOUR),
        ("0 0 1 1 *", "UTC", 365 * DAY),
        ("0 0 29 2 *", "UTC", 4 * 365 * DAY + DAY),
    ],
)
def test_min_gap(expression: str, zone: str, gap: int) -> None:
    assert Cron(expression, zone).min_gap_from(ms("2026-01-01T00:00+00:00")) == gap


def test_min_gap_is_cached() -> None:
    cron = Cron("*/5 * * * *", "UTC")
    assert cron.min_gap_ms() == 5 * MINUTE
    assert cron.min_gap_ms() == 5 * MINUTE


# -- Every and Once -------------------------------------------------------------------

def test_every_grid_and_offset() -> None:
    every = Every(10_000, offset_ms=3_000)
    assert every.next_after(0) == 3_000
    assert every.next_after(3_000) == 13_000
    assert every.latest_at_or_before(12_999) == 3_000
    assert every.latest_at_or_before(13_000) == 13_000
    assert every.min_gap_ms() == 10_000
    assert every.describe() == "every 10s (offset 3s)"
    with pytest.raises(ValueError):
        Every(0)


def test_once() -> None:
    when = datetime(2026, 6, 1, 12, tzinfo=UTC)
    once = Once.from_datetime(when)
    at = ms("2026-06-01T12:00+00:00")
    assert once.next_after(at - 1) == at and once.next_after(at) is None
    assert once.latest_at_or_before(at) == at and once.latest_at_or_before(at - 1) is None
    assert once.min_gap_ms() == math.inf
    assert once.describe() == "at 2026-06-01T12:00:00+00:00"


def test_resolve_names_the_instants_of_a_wall_clock_time() -> None:
    every_hour, fixed = Cron("*/15 * * * *", NEW_YORK), Cron("30 1 * * *", NEW_YORK)
    fold_wall, gap_wall = datetime(2026, 11, 1, 1, 30), datetime(2026, 3, 8, 2, 30)
    assert every_hour.resolve(fold_wall) == (ms("2026-11-01T01:30-04:00"),
                                             ms("2026-11-01T01:30-05:00"))
    assert fixed.resolve(fold_wall) == (ms("2026-11-01T01:30-04:00"),)
    assert fixed.resolve(gap_wall) == (ms("2026-03-08T03:00-04:00"),)
    assert fixed.resolve(datetime(2026, 6, 1, 1, 30)) == (ms("2026-06-01T01:30-04:00"),)

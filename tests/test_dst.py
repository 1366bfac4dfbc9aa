"""DST policies of cron jobs (``dst_gap``, ``dst_fold``): options, fixed cases, the preview.

tests/test_dst_oracle.py checks every policy against an enumeration of wall-clock minutes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from django_anarchon.backends.memory import MemoryBackend
from django_anarchon.engine import Scheduler
from django_anarchon.exceptions import ConfigurationError
from django_anarchon.jobs import build_job
from django_anarchon.schedules import Cron, Every, preview

MINUTE = 60_000
HOUR = 60 * MINUTE
NEW_YORK = "America/New_York"


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def local(instant: int, zone: str) -> str:
    return datetime.fromtimestamp(instant / 1000, ZoneInfo(zone)).isoformat()


def walk(cron: Cron, start: int, end: int) -> list[str]:
    out: list[str] = []
    cursor: int | None = start
    while True:
        assert cursor is not None
        cursor = cron.next_after(cursor)
        if cursor is None or cursor >= end:
            return out
        out.append(local(cursor, cron.timezone))


# -- the bugs this change fixes ---------------------------------------------------------

def test_hourly_does_not_fire_twice_in_half_an_hour_across_a_30_minute_gap() -> None:
    cron = Cron("0 * * * *", "Australia/Lord_Howe")
    assert walk(cron, ms("2026-10-04T00:30+10:30"), ms("2026-10-04T04:30+11:00")) == [
        "2026-10-04T01:00:00+10:30", "2026-10-04T03:00:00+11:00", "2026-10-04T04:00:00+11:00"]


def test_hourly_does_not_fire_twice_in_a_quarter_hour_across_a_chatham_gap() -> None:
    cron = Cron("0 * * * *", "Pacific/Chatham")
    assert walk(cron, ms("2026-09-27T01:30+12:45"), ms("2026-09-27T05:30+13:45")) == [
        "2026-09-27T02:00:00+12:45", "2026-09-27T04:00:00+13:45", "2026-09-27T05:00:00+13:45"]


def test_the_ledger_marks_a_gap_skip_only_where_no_slot_fires() -> None:
    """The ``dst`` mark lands at the transition; where a slot fires right there (hourly in
    a whole-hour zone) nothing was skipped and the slot's own entry stands."""
    ny = ms("2026-03-08T03:00-04:00")
    lord_howe = ms("2026-10-04T02:30+11:00")
    day = 86_400_000
    assert Cron("0 * * * *", NEW_YORK).gap_skips(ny - day, ny + day) == []
    assert Cron("30 2 * * *", NEW_YORK, dst_gap="skip").gap_skips(ny - day, ny + day) == [ny]
    assert Cron("30 2 * * *", NEW_YORK).gap_skips(ny - day, ny + day) == []  # shifted: runs
    assert Cron("0 * * * *", "Australia/Lord_Howe").gap_skips(
        lord_howe - day, lord_howe + day) == [lord_howe]


def test_a_gap_slot_is_found_from_the_last_instant_before_the_gap() -> None:
    cron = Cron("30 2 * * *", "America/New_York")
    transition = ms("2026-03-08T03:00-04:00")
    assert cron.next_after(transition - 1) == transition


def test_the_latest_slot_can_be_a_second_occurrence_hours_after_its_fold() -> None:
    """Santiago falls back at Saturday 24:00 to 23:00; on Saturdays only, the last slot is
    23:00 -04, the repeated hour. Catch-up asked on Sunday got 23:00 -03, an hour early."""
    cron = Cron("0 * * * 6", "America/Santiago")
    sunday_noon = ms("2026-04-05T12:00-04:00")
    assert local(cron.latest_at_or_before(sunday_noon) or 0, cron.timezone) == (
        "2026-04-04T23:00:00-04:00")
    daily = Cron("30 1 * * *", NEW_YORK, dst_fold="both")
    assert local(daily.latest_at_or_before(ms("2026-11-01T09:00-05:00")) or 0, NEW_YORK) == (
        "2026-11-01T01:30:00-05:00")


# -- the policies on fixed dates ---------------------------------------------------------

@pytest.mark.parametrize(
    ("expression", "gap", "fold", "start", "end", "fired"),
    [
        ("30 2 * * *", "shift", "first", "2026-03-07T12:00-05:00", "2026-03-09T00:00-04:00",
         ["2026-03-08T03:00:00-04:00"]),
        ("30 2 * * *", "skip", "first", "2026-03-07T12:00-05:00", "2026-03-09T00:00-04:00", []),
        ("30 1 * * *", "shift", "first", "2026-10-31T12:00-04:00", "2026-11-02T00:00-05:00",
         ["2026-11-01T01:30:00-04:00"]),
        ("30 1 * * *", "shift", "second", "2026-10-31T12:00-04:00", "2026-11-02T00:00-05:00",
         ["2026-11-01T01:30:00-05:00"]),
        ("30 1 * * *", "skip", "both", "2026-10-31T12:00-04:00", "2026-11-02T00:00-05:00",
         ["2026-11-01T01:30:00-04:00", "2026-11-01T01:30:00-05:00"]),
        # Havana falls back at 01:00 to 00:00 and springs forward at 00:00 to 01:00.
        ("0 0 * * *", "shift", "second", "2026-10-31T12:00-04:00", "2026-11-02T12:00-05:00",
         ["2026-11-01T00:00:00-05:00", "2026-11-02T00:00:00-05:00"]),
        ("0 0 * * *", "skip", "first", "2026-03-07T12:00-05:00", "2026-03-09T12:00-04:00",
         ["2026-03-09T00:00:00-04:00"]),
    ],
)
def test_policies_on_fixed_dates(
    expression: str, gap: Any, fold: Any, start: str, end: str, fired: list[str]
) -> None:
    zone = "America/Havana" if expression == "0 0 * * *" else NEW_YORK
    cron = Cron(expression, zone, dst_gap=gap, dst_fold=fold)
    assert walk(cron, ms(start), ms(end)) == fired
    for slot in fired:
        assert cron.latest_at_or_before(ms(slot)) == ms(slot)


def test_policies_do_not_apply_to_every_hour_expressions() -> None:
    start, end = ms("2026-10-31T23:00-04:00"), ms("2026-11-01T03:00-05:00")
    expected = walk(Cron("30 * * * *", NEW_YORK), start, end)
    assert len(expected) == 5  # 23:30, 00:30, 01:30 EDT, 01:30 EST, 02:30 EST
    for gap in ("shift", "skip"):
        for fold in ("first", "second", "both"):
            cron = Cron("30 * * * *", NEW_YORK, dst_gap=gap, dst_fold=fold)  # type: ignore[arg-type]
            assert walk(cron, start, end) == expected


# -- the options --------------------------------------------------------------------------

def handler(ctx: Any) -> None:
    """Never called."""


def test_options_reach_the_schedule_and_its_description() -> None:
    job = build_job("j", "cron", "30 2 * * *", handler,
                    {"timezone": NEW_YORK, "dst_gap": "skip", "dst_fold": "both"})
    assert isinstance(job.schedule, Cron)
    assert (job.schedule.dst_gap, job.schedule.dst_fold) == ("skip", "both")
    assert job.schedule.describe() == 'cron "30 2 * * *" (America/New_York, dst_gap=skip, dst_fold=both)'
    plain = build_job("j", "cron", "30 2 * * *", handler, {"timezone": NEW_YORK, "dst_gap": "shift"})
    assert plain.schedule.describe() == 'cron "30 2 * * *" (America/New_York)'


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dst_gap": "later"}, "job 'j', option 'dst_gap' = 'later': must be 'shift' or 'skip'"),
        ({"dst_gap": None}, "job 'j', option 'dst_gap' = None: must be 'shift' or 'skip'"),
        ({"dst_fold": "last"},
         "job 'j', option 'dst_fold' = 'last': must be 'first', 'second' or 'both'"),
        ({"dst_fold": ["first"]},
         "job 'j', option 'dst_fold' = ['first']: must be 'first', 'second' or 'both'"),
    ],
)
def test_bad_values_are_named(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        build_job("j", "cron", "30 2 * * *", handler, options)
    assert str(info.value) == message


@pytest.mark.parametrize("kind", ["every", "once"])
@pytest.mark.parametrize("option", ["dst_gap", "dst_fold"])
def test_refused_on_every_and_once_jobs(kind: Any, option: str) -> None:
    spec = "10s" if kind == "every" else "2030-01-01T00:00:00+00:00"
    with pytest.raises(ConfigurationError, match=f"option '{option}' = 'skip': unknown option for "
                       f"{kind} jobs \\('{option}' is for cron jobs only\\)"):
        build_job("j", kind, spec, handler, {option: "skip"})


def test_scheduler_cron_takes_the_options() -> None:
    scheduler = Scheduler(backend=MemoryBackend())
    job = scheduler.cron("j", "30 1 * * *", handler, timezone=NEW_YORK, dst_fold="second")
    assert isinstance(job.schedule, Cron) and job.schedule.dst_fold == "second"
    with pytest.raises(ConfigurationError, match="option 'dst_fold' = 'none'"):
        scheduler.cron("k", "30 1 * * *", handler, dst_fold="none")
    with pytest.raises(ConfigurationError, match="'dst_gap' is for cron jobs only"):
        scheduler.every("e", "10s", handler, dst_gap="skip")


# -- the preview ---------------------------------------------------------------------------

def labels(cron: Cron, start: str, n: int) -> list[tuple[str, str]]:
    return [(fire.local_text(), fire.label()) for fire in cron.preview(ms(start), n)]


def test_preview_marks_a_shifted_slot() -> None:
    cron = Cron("0,30 2 * * *", NEW_YORK)
    assert labels(cron, "2026-03-07T03:00-05:00", 2) == [
        ("2026-03-08 03:00:00 EDT", "shifted from 02:00 to 02:30"),
        ("2026-03-09 02:00:00 EDT", ""),
    ]
    fire = cron.preview(ms("2026-03-07T03:00-05:00"), 1)[0]
    assert fire.utc_text() == "2026-03-08 07:00:00 UTC" and fire.mark == "shifted"


def test_preview_lists_skipped_times_apart() -> None:
    cron = Cron("30 2 * * *", NEW_YORK, dst_gap="skip")
    assert labels(cron, "2026-03-07T03:00-05:00", 1) == [
        ("2026-03-08 02:30:00 (not on the clock)", "skipped 02:30"),
        ("2026-03-09 02:30:00 EDT", ""),
    ]
    skipped = cron.preview(ms("2026-03-07T03:00-05:00"), 1)[0]
    assert skipped.at_ms is None and skipped.utc_text() == "-"
    assert skipped.to_dict() == {"at": None, "local": "2026-03-08 02:30:00 (not on the clock)",
                                 "zone": NEW_YORK, "mark": "skipped", "dst": "skipped 02:30"}


def test_preview_of_every_hour_expressions() -> None:
    lord_howe = Cron("0 * * * *", "Australia/Lord_Howe")
    assert labels(lord_howe, "2026-10-04T00:30+10:30", 2) == [
        ("2026-10-04 01:00:00 +1030", ""),
        ("2026-10-04 02:00:00 (not on the clock)", "skipped 02:00"),
        ("2026-10-04 03:00:00 +11", ""),
    ]
    quarter = Cron("*/15 * * * *", NEW_YORK)
    assert [label for _, label in labels(quarter, "2026-11-01T00:40-04:00", 10)] == [
        "", "fold: first", "fold: first", "fold: first", "fold: first",
        "fold: second", "fold: second", "fold: second", "fold: second", ""]
    assert labels(quarter, "2026-03-08T01:50-05:00", 1) == [
        ("2026-03-08 02:00:00 (not on the clock)", "skipped 02:00 to 02:45"),
        ("2026-03-08 03:00:00 EDT", ""),
    ]


def test_preview_of_a_fold_under_each_policy() -> None:
    start = "2026-10-31T12:00-04:00"
    assert labels(Cron("30 1 * * *", NEW_YORK), start, 1) == [
        ("2026-11-01 01:30:00 EDT", "fold: first")]
    assert labels(Cron("30 1 * * *", NEW_YORK, dst_fold="second"), start, 1) == [
        ("2026-11-01 01:30:00 EST", "fold: second")]
    assert labels(Cron("30 1 * * *", NEW_YORK, dst_fold="both"), start, 2) == [
        ("2026-11-01 01:30:00 EDT", "fold: first"), ("2026-11-01 01:30:00 EST", "fold: second")]


def test_preview_of_other_schedules_and_the_end() -> None:
    fires = preview(Every(3_600_000), ms("2026-06-01T00:30+00:00"), 2, "Europe/Athens")
    assert [(f.local_text(), f.utc_text(), f.label()) for f in fires] == [
        ("2026-06-01 04:00:00 EEST", "2026-06-01 01:00:00 UTC", ""),
        ("2026-06-01 05:00:00 EEST", "2026-06-01 02:00:00 UTC", ""),
    ]


def test_dst_events_are_the_gaps_and_folds_with_matches() -> None:
    cron = Cron("30 1,2 * * *", NEW_YORK)
    events = cron.dst_events(ms("2026-01-01T00:00+00:00"), ms("2027-01-01T00:00+00:00"))
    assert [(e.kind, e.first_wall.isoformat(), e.last_wall.isoformat()) for e in events] == [
        ("gap", "2026-03-08T02:30:00", "2026-03-08T02:30:00"),
        ("fold", "2026-11-01T01:30:00", "2026-11-01T01:30:00"),
    ]
    assert Cron("30 12 * * *", NEW_YORK).dst_events(0, ms("2027-01-01T00:00+00:00")) == []
    assert Cron("*/5 * * * *", NEW_YORK).dst_events(0, ms("2027-01-01T00:00+00:00")) == []


def test_cron_refuses_unknown_policies() -> None:
    with pytest.raises(ValueError, match="dst_gap must be 'shift' or 'skip', got 'later'"):
        Cron("30 2 * * *", NEW_YORK, dst_gap="later")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dst_fold must be 'first', 'second' or 'both'"):
        Cron("30 2 * * *", NEW_YORK, dst_fold="all")  # type: ignore[arg-type]


def test_min_gap_counts_a_doubled_fold() -> None:
    jan = ms("2026-01-01T00:00+00:00")
    assert Cron("30 1 * * *", NEW_YORK, dst_fold="both").min_gap_from(jan) == HOUR
    # otherwise the shortest is the 23-hour day of March (01:30 EST, then 01:30 EDT)
    assert Cron("30 1 * * *", NEW_YORK, dst_fold="second").min_gap_from(jan) == 23 * HOUR
    assert Cron("30 1 * * *", NEW_YORK).min_gap_from(jan) == 23 * HOUR

"""DST policies of cron jobs (``dst_gap``, ``dst_fold``), the preview, and an oracle matrix.

The oracle knows nothing of croniter: it enumerates the wall-clock minutes around each
transition with zoneinfo alone, matches them with a tiny cron matcher, and derives the
expected UTC instants per policy, which ``next_after`` and ``latest_at_or_before`` must give.
"""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from django_anarchon.schedules import Cron

MINUTE = 60_000
HOUR = 60 * MINUTE


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


def test_a_gap_slot_is_found_from_the_last_instant_before_the_gap() -> None:
    cron = Cron("30 2 * * *", "America/New_York")
    transition = ms("2026-03-08T03:00-04:00")
    assert cron.next_after(transition - 1) == transition

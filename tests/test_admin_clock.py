"""The admin's clock: leases judged by each database server's clock; times as people read them."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.test import override_settings

from django_anarchon import admin as anarchon_admin

NOW = datetime(2026, 12, 1, 8, 5, 30, tzinfo=UTC)


@pytest.mark.parametrize(("seconds", "expected"), [
    (-3, "just now"),  # a worker's clock a little ahead of the web server's
    (0.4, "just now"),
    (1, "1 second ago"),
    (4, "4 seconds ago"),
    (59.9, "59 seconds ago"),
    (60, "1 minute ago"),
    (125, "2 minutes ago"),
    (3 * 3600 + 300, "3 hours, 5 minutes ago"),
])
def test_ago_counts_seconds_under_a_minute(seconds: float, expected: str) -> None:
    """Django's timesince says "0 minutes" for a run a few seconds old."""
    said = anarchon_admin.format_ago(NOW - timedelta(seconds=seconds), NOW)
    assert said.replace("\xa0", " ") == expected  # timesince keeps "3 hours" on one line


@pytest.mark.parametrize(("ms", "expected"), [
    (None, ""), (0, "0ms"), (816, "816ms"), (1000, "1s"), (5_449, "5.4s"), (9_960, "10s"),
    (20_816, "21s"), (120_004, "2m"), (599_400, "9m59s"), (3_600_000 + 5 * 60_000 + 31_000, "1h6m"),
])
def test_durations_are_rounded_to_what_matters(ms: int | None, expected: str) -> None:
    assert anarchon_admin.format_ms(ms) == expected


def test_timestamps_have_seconds_and_the_current_zone() -> None:
    assert anarchon_admin.format_when(NOW) == "2026-12-01 08:05:30 UTC"
    with override_settings(TIME_ZONE="America/New_York"):
        assert anarchon_admin.format_when(NOW) == "2026-12-01 03:05:30 EST"
    assert anarchon_admin.format_when(None) == "-"


@pytest.mark.postgres
@pytest.mark.mysql
@pytest.mark.usefixtures("postgres_database", "mysql_database", "database_access")
def test_the_leases_page_reads_each_database_servers_clock() -> None:
    for alias in ("default", "postgres", "mysql"):
        before = int(time.time() * 1000)
        now = anarchon_admin.database_now_ms(alias)
        after = int(time.time() * 1000)
        # same machine: the server's clock agrees with ours to well within a second
        assert before - 1000 <= now <= after + 1000, (alias, before, now, after)

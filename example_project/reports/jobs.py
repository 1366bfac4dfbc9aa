"""Report jobs: a cron job in a time zone, a one-off, and a long job."""

from __future__ import annotations

import os

from django_anarchon import at, cron, every
from django_anarchon.engine import JobContext

#: The demo script sets this a few seconds ahead so the one-off fires while it watches.
ONE_OFF_AT = os.environ.get("ANARCHON_DEMO_AT", "2030-01-01T09:00:00+02:00")


@cron("*/10 * * * * *", timezone="America/New_York", name="reports.ticker")
def ticker(ctx: JobContext) -> None:
    """Six fields (seconds first): every 10 seconds, evaluated on New York's wall clock."""


@cron("30 8 * * 1-5", timezone="Europe/Athens")
def morning_summary(ctx: JobContext) -> None:
    """Weekdays at 08:30 in Athens, whatever the server's time zone, DST included."""


@at(ONE_OFF_AT, catch_up="1m")
def launch_announcement(ctx: JobContext) -> None:
    """Runs once, at one instant; a worker that starts within a minute after it catches up."""


@every("20s", timeout="15s")
def rebuild_search_index(ctx: JobContext) -> None:
    """A long job: 12 seconds of work that stops early when the worker stops.

    ``ctx.signal.wait()`` sleeps and wakes on abort (SIGTERM, takeover, timeout);
    raising then records the attempt as ``interrupted`` rather than ``success``.
    """
    for _ in range(12):
        ctx.signal.wait(1)
        ctx.signal.raise_if_aborted()

"""Jobs outside jobs.py, found because jobs.py imports this module."""

from typing import Any

from django_anarchon import cron


@cron("0 6 * * *")
def nightly_report(ctx: Any) -> None:
    """Registered as "otherjobsapp.nightly_report"."""

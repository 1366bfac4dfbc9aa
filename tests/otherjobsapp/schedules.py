"""Jobs outside jobs.py, found because the app's ready() imports this module."""

from typing import Any

from django_anarchon import every


@every("15m")
def retry_invoices(ctx: Any) -> None:
    """Registered as "otherjobsapp.retry_invoices"."""

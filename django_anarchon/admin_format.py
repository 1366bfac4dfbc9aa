"""How the admin writes statuses, times and durations (every page and the timeline)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import dateformat, timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.timesince import timesince
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from .durations import format_duration

__all__ = [
    "TIMESTAMP_FORMAT", "attempt_and_reason", "error_summary", "format_ago", "format_ms", "format_when", "status_badge",
]

#: Every timestamp the admin shows: seconds (an every-5s job's rows differ) and the zone.
TIMESTAMP_FORMAT = "Y-m-d H:i:s T"


def status_badge(status: str, title: str = "") -> SafeString:
    return format_html(
        '<span class="anarchon-status anarchon-{}" title="{}">{}</span>', status, title or status,
        status,
    )


def format_ms(ms: int | None) -> str:
    """A duration as a person reads it: "816ms", "5.4s", "21s", "9m59s", "2h5m"."""
    if ms is None:
        return ""
    if ms < 1000:
        return f"{max(ms, 0)}ms"
    if ms < 10_000:
        return f"{ms / 1000:.1f}".removesuffix(".0") + "s"
    unit = 60_000 if ms >= 3_600_000 else 1000  # from an hour up, seconds are noise
    return format_duration(round(ms / unit) * unit)


def format_when(value: datetime | None) -> str:
    """A timestamp in the current time zone, to the second, with the zone's name."""
    if value is None:
        return "-"
    if timezone.is_aware(value):
        value = timezone.localtime(value)
    return dateformat.format(value, TIMESTAMP_FORMAT)


def format_ago(value: datetime, now: datetime | None = None) -> str:
    """ "4 seconds ago" under a minute (Django's timesince says "0 minutes"), else timesince."""
    now = timezone.now() if now is None else now
    seconds = int((now - value).total_seconds())
    if seconds < 1:  # also a worker's clock a little ahead of the web server's
        return str(_("just now"))
    if seconds < 60:
        return ngettext("%(count)d second ago", "%(count)d seconds ago", seconds) % {
            "count": seconds}
    return str(_("%(time)s ago") % {"time": timesince(value, now)})


def error_summary(error: str | None, limit: int = 120) -> str:
    """The error's first line: its type and message (the engine writes them first)."""
    if not error or not error.strip():
        return ""
    line = error.strip().splitlines()[0]
    return line if len(line) <= limit else line[: limit - 1] + "…"


def attempt_and_reason(obj: Any) -> str:
    """ "#2 takeover": which attempt and why, in one narrow column (a ``RunRecord`` or a
    ``Run`` / ``RunAttempt`` row)."""
    text = f"#{obj.attempt} {obj.reason}"
    if obj.manual and obj.reason != "manual":
        text += f" ({_('manual')})"
    return text

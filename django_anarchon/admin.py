"""The admin: run history, live leases, run, backfill and enqueue records, and the Jobs pages.

History and leases are the database backend's tables. The Jobs page and the per-job
page (admin_pages.py) read every configured scheduler through its public API, so they
work with any backend; their reads run in a small thread pool with a deadline and a
short cache (admin_jobs.py), so a slow store makes a page say so instead of hanging it.

"Run now" and backfills never run a job inside the web request: they file a row
(``RunRequest``, ``BackfillRequest``) that a worker of that scheduler picks up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.contrib import admin
from django.db import connections, router
from django.db.models import BigIntegerField, QuerySet, Value
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from .admin_format import (
    attempt_and_reason,
    error_summary,
    format_ago,
    format_ms,
    format_when,
    status_badge,
)
from .admin_job_page import BackfillRow
from .admin_jobs import collect_sections, history_cache
from .admin_pages import PLAN_LISTED, ReadOnlyAdmin, ScheduledJobAdmin
from .backends.base import ms_to_datetime
from .models import BackfillRequest, EnqueuedTask, Run, RunAttempt, RunRequest, ScheduledJob

__all__ = ["collect_sections", "format_ago", "format_ms", "format_when", "history_cache"]


def timestamp_column(field: str, description: Any, ordering: str | None = None
                     ) -> Callable[[Any, Any], str]:
    """A list or detail column showing ``obj.<field>`` through :func:`format_when`."""

    @admin.display(description=description, ordering=ordering or field)
    def column(self: Any, obj: Any) -> str:
        return format_when(getattr(obj, field))

    return column


def ms_column(field: str, description: Any) -> Callable[[Any, Any], str]:
    """Like :func:`timestamp_column`, for the epoch-millisecond columns of the leases table."""

    @admin.display(description=description, ordering=field)
    def column(self: Any, obj: Any) -> str:
        value = getattr(obj, field)
        return "-" if value is None else format_when(ms_to_datetime(value))

    return column


@admin.register(RunAttempt)
class RunAttemptAdmin(ReadOnlyAdmin):
    # Fits 1280 px beside the filters: attempt and reason share a column, the start time
    # (the scheduled time plus lateness) is on the attempt's page.
    list_display = ("job", "scheduled", "status_display", "instance_id", "attempt_reason",
                    "duration", "short_error")
    list_filter = (
        ("job", admin.AllValuesFieldListFilter),
        "status",
        ("instance_id", admin.AllValuesFieldListFilter),
        "reason",
        "manual",
    )
    date_hierarchy = "started_at"
    search_fields = ("job", "instance_id", "error")
    fields = ("job", "scheduled", "status_display", "instance_id", "attempt", "reason",
              "manual", "started", "finished", "duration", "error_display")
    readonly_fields = ("scheduled", "started", "finished", "status_display", "duration",
                       "error_display")
    list_per_page = 50

    scheduled = timestamp_column("scheduled_at", _("scheduled at"))
    started = timestamp_column("started_at", _("started at"))
    finished = timestamp_column("finished_at", _("finished at"))

    @admin.display(description=_("status"), ordering="status")
    def status_display(self, obj: RunAttempt) -> SafeString:
        return status_badge(obj.status)

    @admin.display(description=_("attempt"), ordering="attempt")
    def attempt_reason(self, obj: RunAttempt) -> str:
        return attempt_and_reason(obj)

    @admin.display(description=_("duration"), ordering="duration_ms")
    def duration(self, obj: RunAttempt) -> str:
        return format_ms(obj.duration_ms)

    @admin.display(description=_("error"))
    def short_error(self, obj: RunAttempt) -> str:
        return error_summary(obj.error)

    @admin.display(description=_("error"))
    def error_display(self, obj: RunAttempt) -> SafeString | str:
        if not obj.error:
            return "-"
        return format_html('<pre class="anarchon-error">{}</pre>', obj.error)


def database_now_ms(using: str) -> int:
    """The database server's clock in epoch ms: leases are judged by it, never by ours."""
    from .backends.database.clock import SUPPORTED_VENDORS, now_ms_sql

    connection = connections[using]
    if connection.vendor not in SUPPORTED_VENDORS:
        return int(time.time() * 1000)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {now_ms_sql(connection.vendor)}")
        row = cursor.fetchone()
    return int(row[0])


class LeaseFilter(admin.SimpleListFilter):
    title = _("lease")
    parameter_name = "lease"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("alive", _("alive")), ("lapsed", _("lapsed")), ("finished", _("finished"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        if value == "finished":
            return queryset.exclude(state="running")
        now = database_now_ms(router.db_for_read(Run))
        running = queryset.filter(state="running")
        if value == "alive":
            return running.filter(lease_until_ms__gt=now)
        return running.filter(lease_until_ms__lte=now)


@admin.register(Run)
class RunLeaseAdmin(ReadOnlyAdmin):
    # The lease column says running, finished or claimed, so the state has no column.
    list_display = ("job", "scheduled", "attempt_reason", "instance_id", "lease_display",
                    "expires_in", "last_status")
    list_filter = (LeaseFilter, ("job", admin.AllValuesFieldListFilter), "state", "reason")
    search_fields = ("job", "instance_id")
    ordering = ("-lease_until_ms",)
    list_per_page = 50
    # The lease token stays out of sight: it is what lets an owner heartbeat its run.
    fields = ("job", "scheduled", "attempt", "reason", "manual", "instance_id", "state",
              "lease_display", "expires_in", "lease_until", "started", "finished", "status",
              "kept_for", "max_attempts")
    readonly_fields = ("scheduled", "lease_display", "expires_in", "lease_until", "started",
                       "finished", "kept_for")

    scheduled = ms_column("slot", _("scheduled at"))
    lease_until = ms_column("lease_until_ms", _("lease until"))
    started = ms_column("started_at_ms", _("attempt started at"))
    finished = ms_column("finished_at_ms", _("finished at"))

    def get_queryset(self, request: HttpRequest) -> QuerySet[Run]:
        # One read of the database clock per page: every row is judged against the same "now".
        now = database_now_ms(router.db_for_read(Run))
        queryset: QuerySet[Run] = super().get_queryset(request)
        return queryset.annotate(db_now_ms=Value(now, BigIntegerField()))

    @staticmethod
    def _now(obj: Run) -> int:
        now = getattr(obj, "db_now_ms", None)
        return int(now) if now is not None else database_now_ms(router.db_for_read(Run))

    @admin.display(description=_("attempt"), ordering="attempt")
    def attempt_reason(self, obj: Run) -> str:
        return attempt_and_reason(obj)

    @admin.display(description=_("lease"))
    def lease_display(self, obj: Run) -> SafeString:
        if obj.state != "running":
            return status_badge("finished", obj.get_state_display())
        now = self._now(obj)
        if obj.lease_until_ms > now:
            return status_badge("alive", str(_("alive")))
        return status_badge("lapsed", str(_("lapsed: a backup may take it over")))

    @admin.display(description=_("expires in"), ordering="lease_until_ms")
    def expires_in(self, obj: Run) -> str:
        if obj.state != "running":
            return "-"
        left = obj.lease_until_ms - self._now(obj)
        if left > 0:
            return format_ms(left)
        return str(_("lapsed %(ago)s ago") % {"ago": format_ms(-left)})

    @admin.display(description=_("last status"), ordering="status")
    def last_status(self, obj: Run) -> SafeString | str:
        return status_badge(obj.status) if obj.status else "-"

    @admin.display(description=_("kept for"), ordering="keep_ms")
    def kept_for(self, obj: Run) -> str:
        return "-" if obj.keep_ms is None else format_ms(obj.keep_ms)


@admin.register(EnqueuedTask)
class EnqueuedTaskAdmin(ReadOnlyAdmin):
    """The tasks that jobs with a task target enqueued, one per (job, slot) (docs/tasks.md)."""

    list_display = ("job", "scheduled", "state", "task_id", "attempt", "instance_id",
                    "enqueued_at")
    list_filter = ("state", ("job", admin.AllValuesFieldListFilter))
    search_fields = ("job", "task_id")
    ordering = ("-slot",)
    list_per_page = 50
    fields = ("job", "scheduled", "target", "state", "task_id", "attempt", "instance_id",
              "enqueued_at", "error")
    readonly_fields = fields
    scheduled = ms_column("slot", _("scheduled at"))


@admin.register(RunRequest)
class RunRequestAdmin(ReadOnlyAdmin):
    list_display = ("job", "scheduler", "requested_by", "requested", "claimed", "manual_run")
    list_filter = ("scheduler", ("job", admin.AllValuesFieldListFilter))
    search_fields = ("job", "requested_by", "claimed_by")
    date_hierarchy = "requested_at"
    fields = ("job", "scheduler", "data", "requested_by", "requested", "claimed_by",
              "claimed_at_display", "manual_run")
    readonly_fields = ("requested", "claimed_at_display", "manual_run")

    requested = timestamp_column("requested_at", _("requested at"))
    claimed_at_display = timestamp_column("claimed_at", _("claimed at"))

    @admin.display(description=_("claimed by"), ordering="claimed_at")
    def claimed(self, obj: RunRequest) -> str:
        """Who took it and how soon: one column instead of an instance and a timestamp."""
        if obj.claimed_at is None:
            return str(_("waiting for a worker"))
        delay = round((obj.claimed_at - obj.requested_at).total_seconds() * 1000)
        return str(_("%(instance)s, %(delay)s later")
                   % {"instance": obj.claimed_by, "delay": format_ms(delay)})

    @admin.display(description=_("manual run"), ordering="slot")
    def manual_run(self, obj: RunRequest) -> str:
        return "-" if obj.slot is None else format_when(ms_to_datetime(obj.slot))


@admin.register(BackfillRequest)
class BackfillRequestAdmin(ReadOnlyAdmin):
    """The filed backfills (``Scheduler.backfill``, the admin's form, ``anarchon_backfill``)."""

    list_display = ("job", "scheduler", "requested_by", "requested", "range", "progress",
                    "state")
    list_filter = ("scheduler", ("job", admin.AllValuesFieldListFilter), "overlap")
    search_fields = ("job", "requested_by", "claimed_by")
    date_hierarchy = "requested_at"
    fields = ("job", "scheduler", "requested_by", "requested", "range", "overlap", "progress",
              "state", "claimed_by", "claimed", "finished", "slot_list")
    readonly_fields = ("requested", "range", "progress", "state", "claimed", "finished",
                       "slot_list")

    requested = timestamp_column("requested_at", _("requested at"))
    claimed = timestamp_column("claimed_at", _("last progress at"))
    finished = timestamp_column("finished_at", _("finished at"))

    @admin.display(description=_("range"), ordering="start_ms")
    def range(self, obj: BackfillRequest) -> str:
        return BackfillRow(obj).range

    @admin.display(description=_("progress"), ordering="done")
    def progress(self, obj: BackfillRequest) -> str:
        row = BackfillRow(obj)
        return f"{obj.done}/{row.total} ({row.percent}%)"

    @admin.display(description=_("state"))
    def state(self, obj: BackfillRequest) -> str:
        return BackfillRow(obj).state

    @admin.display(description=_("slots"))
    def slot_list(self, obj: BackfillRequest) -> str:
        slots = [format_when(ms_to_datetime(int(s))) for s in obj.slots[:PLAN_LISTED]]
        more = len(obj.slots) - len(slots)
        return ", ".join(slots) + (f" … (+{more})" if more > 0 else "")


# The Jobs page and the per-job page (admin_pages.py): no table of their own.
admin.site.register(ScheduledJob, ScheduledJobAdmin)

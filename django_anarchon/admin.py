"""The admin: run history, live leases, run-now requests, and a Jobs page for every scheduler.

History and leases are the database backend's tables. The Jobs page reads every
configured scheduler through ``Scheduler.jobs()`` and ``history()``, so it works with
any backend; its reads run in a small thread pool with a deadline and a short cache,
so a slow store makes the page say so instead of hanging it.

"Run now" never runs a job inside the web request: it files a ``RunRequest`` row that
a worker of that scheduler picks up.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import connections, router
from django.db.models import BigIntegerField, QuerySet, Value
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import dateformat, timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.timesince import timesince
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from . import conf
from .backends.base import JobInfo, RunRecord, ms_to_datetime
from .durations import format_duration
from .enqueue.links import TaskLink, task_links
from .exceptions import UnknownJobError
from .models import Run, RunAttempt, RunRequest, ScheduledJob
from .redact import describe_backend, redact_text
from .run_data import RunDataError, parse_run_data
from .run_requests import file_request
from .schedules import Fire, preview

if TYPE_CHECKING:
    from .engine import Scheduler

RUN_PERMISSION = "django_anarchon.run_job"
#: How many runs the status strip shows per job.
STRIP_LENGTH = 20
#: How long the Jobs page waits for all stores together before showing what it has.
READ_TIMEOUT_S = 2.0
#: How many coming fire times a job's page lists.
UPCOMING = 10
#: How long a job's history is reused between page loads.
CACHE_TTL_S = 5.0
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


def attempt_and_reason(obj: Run | RunAttempt | RunRecord) -> str:
    """ "#2 takeover": which attempt and why, in one narrow column."""
    text = f"#{obj.attempt} {obj.reason}"
    if obj.manual and obj.reason != "manual":
        text += f" ({_('manual')})"
    return text


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """What the stores write is a record: viewable, never edited by hand.

    Nobody changes these rows in the admin, so they have no change history either: the
    app's change_form.html drops the "History" button.
    """

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


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


# --- the Jobs page -------------------------------------------------------------------


@dataclass
class JobRow:
    scheduler: str
    info: JobInfo
    runs: list[RunRecord] | None = None  # newest first; None: the store did not answer in time
    error: str | None = None
    #: The task the job enqueues instead of running a handler (``TaskTarget.describe()``).
    target: str = ""
    #: The task the last run enqueued, where it is recorded.
    last_task: TaskLink | None = None

    @property
    def last_run(self) -> RunRecord | None:
        return self.runs[0] if self.runs else None

    @property
    def strip(self) -> list[RunRecord]:
        """Oldest first, so the strip reads left to right like a timeline."""
        return list(reversed(self.runs or []))

    @property
    def last_run_ago(self) -> str:
        last = self.last_run
        return format_ago(last.started_at) if last is not None else ""

    @property
    def history_query(self) -> str:
        return history_query(self.scheduler, self.info.name)


def history_query(alias: str, job: str) -> str:
    """The per-job history page's query string.

    The job name travels as a query parameter, never in the path: a path segment ``.``,
    ``..`` (or ``%2e%2e``) is normalised away by browsers and proxies, so jobs named
    ``..`` or ``a/../b`` would link to another job's page.
    """
    return urlencode({"scheduler": alias, "job": job})


@dataclass
class SchedulerSection:
    alias: str
    backend: str = ""
    rows: list[JobRow] = field(default_factory=list)
    error: str | None = None


class _HistoryCache:
    """Recent history reads, shared by page loads; a read in flight is joined, not repeated."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        # (alias, scheduler id, job): a rebuilt scheduler (new settings) never reuses old reads
        self._entries: dict[tuple[str, int, str], tuple[float, Future[list[RunRecord]]]] = {}

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="anarchon-admin")
        return self._pool

    def get(self, alias: str, scheduler: Scheduler, job: str) -> Future[list[RunRecord]]:
        key = (alias, id(scheduler), job)
        now = time.monotonic()
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                started, future = entry
                if not future.done() or now - started < CACHE_TTL_S:
                    return future
            future = self._executor().submit(_read_history, scheduler, job, STRIP_LENGTH)
            self._entries[key] = (now, future)
            return future

    def forget(self, alias: str | None = None, job: str | None = None) -> None:
        with self._lock:
            for key in list(self._entries):
                if (alias is None or key[0] == alias) and (job is None or key[2] == job):
                    del self._entries[key]


def _read_history(scheduler: Scheduler, job: str, limit: int) -> list[RunRecord]:
    try:
        return scheduler.history(job, limit)
    finally:
        connections.close_all()  # this pool thread's own connections only


history_cache = _HistoryCache()


def _upcoming(alias: str, job: str) -> tuple[str, str, list[Fire]]:
    """A job's schedule, its policies and its next fire times, marked where DST moves them
    (pure, no store)."""
    try:
        found = _scheduler(alias).get_job(job)
    except UnknownJobError:
        return "", "", []
    now = int(time.time() * 1000)
    schedule = found.schedule
    upcoming = preview(schedule, now, UPCOMING, timezone.get_current_timezone_name())
    return schedule.describe(), found.policies(), upcoming


def _scheduler(alias: str) -> Scheduler:
    from .handler import schedulers

    return schedulers[alias]


def collect_sections(timeout: float | None = None) -> list[SchedulerSection]:
    """Every job of every configured scheduler with its recent runs, within ``timeout``."""
    timeout = READ_TIMEOUT_S if timeout is None else timeout
    sections: list[SchedulerSection] = []
    pending: list[tuple[JobRow, Future[list[RunRecord]]]] = []
    for alias in conf.get_config():
        section = SchedulerSection(alias)
        sections.append(section)
        try:
            scheduler = _scheduler(alias)
            section.backend = describe_backend(scheduler.backend)
            infos = sorted(scheduler.jobs(), key=lambda info: info.name)
        except Exception as exc:  # a broken scheduler must not hide the others
            section.error = f"{type(exc).__name__}: {exc}"
            continue
        for info in infos:
            row = JobRow(alias, info)
            job = scheduler.get_job(info.name)
            row.target = job.target.describe() if job.target is not None else ""
            section.rows.append(row)
            pending.append((row, history_cache.get(alias, scheduler, info.name)))
    if pending:
        wait_futures([future for _, future in pending], timeout=timeout)
    for row, future in pending:
        if not future.done():
            row.error = str(_("the store did not answer in time"))
        elif (failure := future.exception()) is not None:
            row.error = f"{type(failure).__name__}: {redact_text(failure)}"
        else:
            row.runs = future.result()
    for section in sections:
        for row in section.rows:
            if row.target and row.last_run is not None:
                scheduler = _scheduler(section.alias)
                job = scheduler.get_job(row.info.name)
                row.last_task = task_links(job, scheduler.backend, [row.last_run.slot]).get(
                    row.last_run.slot
                )
    return sections


def strip_html(row: JobRow) -> SafeString:
    cells = []
    for record in row.strip:
        title = f"{record.status} · {format_when(record.scheduled_at)} · {record.instance_id}"
        if record.manual:
            title += " · manual"
        if record.error:
            title += f" · {error_summary(record.error, 200)}"
        cells.append((record.status, title))
    return format_html_join("", '<span class="anarchon-cell anarchon-{}" title="{}"></span>', cells)


@admin.register(ScheduledJob)
class ScheduledJobAdmin(ReadOnlyAdmin):
    """The Jobs page: no rows of its own, it shows what the schedulers know."""

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        wrap: Callable[..., Any] = self.admin_site.admin_view
        return [
            path("", wrap(self.changelist_view), name="{}_{}_changelist".format(*info)),
            path("run/", wrap(self.run_view), name="{}_{}_run".format(*info)),
            path("history/", wrap(self.job_history_view), name="{}_{}_history".format(*info)),
        ]

    def _require_view(self, request: HttpRequest) -> None:
        if not self.has_view_permission(request):
            raise PermissionDenied

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None
                        ) -> HttpResponse:
        self._require_view(request)
        sections = collect_sections()
        can_run = request.user.has_perm(RUN_PERMISSION)
        for section in sections:
            for row in section.rows:
                row.strip_html = strip_html(row)  # type: ignore[attr-defined]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("Jobs"),
            "sections": sections,
            "can_run": can_run,
            "strip_length": STRIP_LENGTH,
            "pending_requests": _pending_requests() if can_run else [],
            "history_admin": self.admin_site.is_registered(RunAttempt)
            and request.user.has_perm("django_anarchon.view_runattempt"),
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_anarchon/jobs.html", context)

    def run_view(self, request: HttpRequest) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not (self.has_view_permission(request) and request.user.has_perm(RUN_PERMISSION)):
            raise PermissionDenied
        alias = request.POST.get("scheduler", "")
        job = request.POST.get("job", "")
        changelist = reverse(f"{self.admin_site.name}:django_anarchon_scheduledjob_changelist")
        if alias not in conf.get_config():
            messages.error(request, _("There is no scheduler %(alias)r.") % {"alias": alias})
            return HttpResponseRedirect(changelist)
        try:
            known = {info.name for info in _scheduler(alias).jobs()}
        except Exception as exc:
            messages.error(request, f"{type(exc).__name__}: {exc}")
            return HttpResponseRedirect(changelist)
        if job not in known:
            messages.error(request, _("Scheduler %(alias)r has no job %(job)r.")
                           % {"alias": alias, "job": job})
            return HttpResponseRedirect(changelist)
        try:
            data = parse_run_data(request.POST.get("data"))
        except RunDataError as exc:
            messages.error(request, _("Run now of %(job)s refused: %(error)s")
                           % {"job": job, "error": exc})
            return HttpResponseRedirect(changelist)
        file_request(alias, job, data=data, requested_by=request.user.get_username())
        history_cache.forget(alias, job)
        # Starts with a fixed word: the admin capitalises each message's first letter
        # (``capfirst`` in admin/base.html), and a job name is shown as it was typed.
        messages.success(request, _("Requested: %(job)s will run on the next worker of "
                                    "scheduler %(alias)r that looks for requests.")
                         % {"job": job, "alias": alias})
        return HttpResponseRedirect(changelist)

    def job_history_view(self, request: HttpRequest) -> HttpResponse:
        self._require_view(request)
        alias = request.GET.get("scheduler", "")
        job = request.GET.get("job")
        if job is None:
            raise Http404("the history link names no job")
        if alias not in conf.get_config():
            raise Http404(f"there is no scheduler {alias!r}")
        error = None
        records: list[RunRecord] = []
        pool = history_cache._executor()
        future = pool.submit(_read_history, _scheduler(alias), job, 100)
        done, _pending = wait_futures([future], timeout=READ_TIMEOUT_S * 2)
        if not done:
            error = str(_("the store did not answer in time"))
        elif (failure := future.exception()) is not None:
            error = f"{type(failure).__name__}: {redact_text(failure)}"
        else:
            records = future.result()
        links: dict[int, TaskLink] = {}
        target = ""
        with contextlib.suppress(UnknownJobError):
            found = _scheduler(alias).get_job(job)
            target = found.target.describe() if found.target is not None else ""
            links = task_links(found, _scheduler(alias).backend, [r.slot for r in records])
        rows = [HistoryRow(r, links.get(r.slot)) for r in records]
        schedule, policies, upcoming = _upcoming(alias, job)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("History of %(job)s") % {"job": job},
            "alias": alias,
            "job": job,
            "rows": rows,
            "schedule": schedule,
            "policies": policies,
            "target": target,
            "upcoming": upcoming,
            "error": error,
            "can_run": request.user.has_perm(RUN_PERMISSION),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_anarchon/job_history.html", context)


@dataclass
class HistoryRow:
    """One attempt as the per-job history page shows it."""

    record: RunRecord
    #: The task the run enqueued (a job with a target), where it is recorded.
    task: TaskLink | None = None

    def badge(self) -> SafeString:
        return status_badge(self.record.status)

    def duration(self) -> str:
        return format_ms(self.record.duration_ms)

    def attempt(self) -> str:
        return attempt_and_reason(self.record)

    def scheduled(self) -> str:
        return format_when(self.record.scheduled_at)

    def started(self) -> str:
        return format_when(self.record.started_at)

    def started_late_by(self) -> str:
        """The start as "+40ms" after the scheduled time: one column narrower than a timestamp."""
        late = round((self.record.started_at - self.record.scheduled_at).total_seconds() * 1000)
        return ("+" if late >= 0 else "-") + format_ms(abs(late))

    def error_summary(self) -> str:
        return error_summary(self.record.error)


def _pending_requests() -> list[RunRequest]:
    return list(RunRequest.objects.filter(claimed_at__isnull=True).order_by("-requested_at")[:20])

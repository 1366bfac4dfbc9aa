"""The admin: run history, live leases, run-now requests, and a Jobs page for every scheduler.

History and leases are the database backend's tables. The Jobs page reads every
configured scheduler through ``Scheduler.jobs()`` and ``history()``, so it works with
any backend; its reads run in a small thread pool with a deadline and a short cache,
so a slow store makes the page say so instead of hanging it.

"Run now" never runs a job inside the web request: it files a ``RunRequest`` row that
a worker of that scheduler picks up.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import connections, router
from django.db.models import BigIntegerField, QuerySet, Value
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from . import conf
from .backends.base import JobInfo, RunRecord
from .durations import format_duration
from .models import Run, RunAttempt, RunRequest, ScheduledJob
from .run_requests import file_request

if TYPE_CHECKING:
    from .engine import Scheduler

RUN_PERMISSION = "django_anarchon.run_job"
#: How many runs the status strip shows per job.
STRIP_LENGTH = 20
#: How long the Jobs page waits for all stores together before showing what it has.
READ_TIMEOUT_S = 2.0
#: How long a job's history is reused between page loads.
CACHE_TTL_S = 5.0


def status_badge(status: str, title: str = "") -> SafeString:
    return format_html(
        '<span class="anarchon-status anarchon-{}" title="{}">{}</span>', status, title or status,
        status,
    )


def format_ms(ms: int | None) -> str:
    return "" if ms is None else format_duration(ms) if ms >= 1 else "0ms"


class ReadOnlyAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """What the stores write is a record: viewable, never edited by hand."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(RunAttempt)
class RunAttemptAdmin(ReadOnlyAdmin):
    list_display = ("job", "scheduled_at", "status_display", "instance_id", "attempt", "reason",
                    "manual", "started_at", "duration", "short_error")
    list_filter = (
        ("job", admin.AllValuesFieldListFilter),
        "status",
        ("instance_id", admin.AllValuesFieldListFilter),
        "reason",
        "manual",
    )
    date_hierarchy = "started_at"
    search_fields = ("job", "instance_id", "error")
    fields = ("job", "slot", "scheduled_at", "status_display", "instance_id", "attempt", "reason",
              "manual", "started_at", "finished_at", "duration", "error_display")
    readonly_fields = ("status_display", "duration", "error_display")
    list_per_page = 50

    @admin.display(description=_("status"), ordering="status")
    def status_display(self, obj: RunAttempt) -> SafeString:
        return status_badge(obj.status)

    @admin.display(description=_("duration"), ordering="duration_ms")
    def duration(self, obj: RunAttempt) -> str:
        return format_ms(obj.duration_ms)

    @admin.display(description=_("error"))
    def short_error(self, obj: RunAttempt) -> str:
        if not obj.error:
            return ""
        last = obj.error.strip().splitlines()[-1]
        return last if len(last) <= 120 else last[:117] + "..."

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
    list_display = ("job", "scheduled_at", "attempt", "instance_id", "state", "lease_display",
                    "expires_in", "status", "reason")
    list_filter = (LeaseFilter, ("job", admin.AllValuesFieldListFilter), "state", "reason")
    search_fields = ("job", "instance_id")
    ordering = ("-lease_until_ms",)
    list_per_page = 50

    def get_queryset(self, request: HttpRequest) -> QuerySet[Run]:
        # One read of the database clock per page: every row is judged against the same "now".
        now = database_now_ms(router.db_for_read(Run))
        queryset: QuerySet[Run] = super().get_queryset(request)
        return queryset.annotate(db_now_ms=Value(now, BigIntegerField()))

    @staticmethod
    def _now(obj: Run) -> int:
        now = getattr(obj, "db_now_ms", None)
        return int(now) if now is not None else database_now_ms(router.db_for_read(Run))

    @admin.display(description=_("scheduled at"), ordering="slot")
    def scheduled_at(self, obj: Run) -> Any:
        return obj.scheduled_at

    @admin.display(description=_("lease"))
    def lease_display(self, obj: Run) -> SafeString:
        if obj.state != "running":
            return status_badge("finished", str(_("finished")))
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


@admin.register(RunRequest)
class RunRequestAdmin(ReadOnlyAdmin):
    list_display = ("job", "scheduler", "requested_by", "requested_at", "claimed_by", "claimed_at",
                    "scheduled_at")
    list_filter = ("scheduler", ("job", admin.AllValuesFieldListFilter))
    search_fields = ("job", "requested_by", "claimed_by")
    date_hierarchy = "requested_at"

    @admin.display(description=_("manual run"), ordering="slot")
    def scheduled_at(self, obj: RunRequest) -> Any:
        from .backends.base import ms_to_datetime

        return ms_to_datetime(obj.slot) if obj.slot is not None else "-"


# --- the Jobs page -------------------------------------------------------------------


@dataclass
class JobRow:
    scheduler: str
    info: JobInfo
    runs: list[RunRecord] | None = None  # newest first; None: the store did not answer in time
    error: str | None = None

    @property
    def last_run(self) -> RunRecord | None:
        return self.runs[0] if self.runs else None

    @property
    def strip(self) -> list[RunRecord]:
        """Oldest first, so the strip reads left to right like a timeline."""
        return list(reversed(self.runs or []))


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
            section.backend = _describe(scheduler)
            infos = sorted(scheduler.jobs(), key=lambda info: info.name)
        except Exception as exc:  # a broken scheduler must not hide the others
            section.error = f"{type(exc).__name__}: {exc}"
            continue
        for info in infos:
            row = JobRow(alias, info)
            section.rows.append(row)
            pending.append((row, history_cache.get(alias, scheduler, info.name)))
    if pending:
        wait_futures([future for _, future in pending], timeout=timeout)
    for row, future in pending:
        if not future.done():
            row.error = str(_("the store did not answer in time"))
        elif (failure := future.exception()) is not None:
            row.error = f"{type(failure).__name__}: {failure}"
        else:
            row.runs = future.result()
    return sections


def _describe(scheduler: Scheduler) -> str:
    backend = scheduler.backend
    describe = getattr(backend, "describe", None)
    return str(describe()) if callable(describe) else str(getattr(backend, "name", backend))


def strip_html(row: JobRow) -> SafeString:
    cells = []
    for record in row.strip:
        when = f"{record.scheduled_at:%Y-%m-%d %H:%M:%S} UTC"
        title = f"{record.status} · {when} · {record.instance_id}"
        if record.manual:
            title += " · manual"
        if record.error:
            title += f" · {record.error.strip().splitlines()[-1][:200]}"
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
            path("<str:alias>/<path:job>/history/", wrap(self.job_history_view),
                 name="{}_{}_history".format(*info)),
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
        data: Any = None
        raw = request.POST.get("data", "").strip()
        if raw:
            try:
                data = json.loads(raw)
            except ValueError as exc:
                messages.error(request, _("The data is not valid JSON: %(error)s") % {"error": exc})
                return HttpResponseRedirect(changelist)
        file_request(alias, job, data=data, requested_by=request.user.get_username())
        history_cache.forget(alias, job)
        messages.success(request, _("%(job)s will run on the next worker of scheduler %(alias)r "
                                    "that looks for requests.") % {"job": job, "alias": alias})
        return HttpResponseRedirect(changelist)

    def job_history_view(self, request: HttpRequest, alias: str, job: str) -> HttpResponse:
        self._require_view(request)
        if alias not in conf.get_config():
            raise PermissionDenied
        error = None
        records: list[RunRecord] = []
        pool = history_cache._executor()
        future = pool.submit(_read_history, _scheduler(alias), job, 100)
        done, _pending = wait_futures([future], timeout=READ_TIMEOUT_S * 2)
        if not done:
            error = str(_("the store did not answer in time"))
        elif (failure := future.exception()) is not None:
            error = f"{type(failure).__name__}: {failure}"
        else:
            records = future.result()
        rows = [(r, status_badge(r.status), format_ms(r.duration_ms)) for r in records]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("History of %(job)s") % {"job": job},
            "alias": alias,
            "job": job,
            "rows": rows,
            "error": error,
            "can_run": request.user.has_perm(RUN_PERMISSION),
            "now": timezone.now(),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_anarchon/job_history.html", context)


def _pending_requests() -> list[RunRequest]:
    return list(RunRequest.objects.filter(claimed_at__isnull=True).order_by("-requested_at")[:20])

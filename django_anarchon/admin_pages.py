"""The Jobs page and the per-job page, and the forms they post: run now, pause and
resume, backfill.

A model admin with no rows of its own (``ScheduledJob`` is a proxy that carries the
permissions): its views check the permission of each action (and Django's middleware
the CSRF token), then show what the schedulers know (admin_jobs.py) or hand the form
to the scheduler (admin_actions.py) and say how it went in one message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.functional import Promise
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from . import admin_actions as actions
from . import conf
from .admin_format import format_when
from .admin_job_page import backfill_rows, read_job_page
from .admin_jobs import (
    STRIP_LENGTH,
    collect_sections,
    history_cache,
    history_query,
    pause_text,
    pending_requests,
    scheduler_of,
)
from .admin_timeline import SPANS, parse_span
from .backends.base import ms_to_datetime
from .engine.operations import DEFAULT_BACKFILL_MAX, BackfillPlan
from .models import BackfillRequest, RunAttempt
from .redact import redact_text
from .run_data import RunDataError, parse_run_data
from .run_requests import file_request

__all__ = ["BACKFILL_PERMISSION", "PAUSE_PERMISSION", "RUN_PERMISSION", "ScheduledJobAdmin"]

StrOrPromise = str | Promise  # a gettext_lazy text
RUN_PERMISSION = "django_anarchon.run_job"
PAUSE_PERMISSION = "django_anarchon.pause_job"
BACKFILL_PERMISSION = "django_anarchon.backfill_job"
#: How many slots a dry run (or a request's page) lists before "+N".
PLAN_LISTED = 60


def _failed(request: HttpRequest, refused: StrOrPromise, unanswered: StrOrPromise, job: str,
            exc: actions.Refused) -> None:
    """One line: an error for a refusal, a warning for a store that did not answer (the
    action may still have landed)."""
    if isinstance(exc, actions.NoAnswer):
        messages.warning(request, unanswered % {"job": job, "error": exc})
    else:
        messages.error(request, refused % {"job": job, "error": exc})


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


class ScheduledJobAdmin(ReadOnlyAdmin):
    """The Jobs page and the per-job page: no rows of their own, they show what the
    schedulers know (admin_jobs.py), and file what the operator asks (admin_actions.py)."""

    def get_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        wrap: Callable[..., Any] = self.admin_site.admin_view
        return [
            path("", wrap(self.changelist_view), name="{}_{}_changelist".format(*info)),
            path("run/", wrap(self.run_view), name="{}_{}_run".format(*info)),
            path("history/", wrap(self.job_history_view), name="{}_{}_history".format(*info)),
            path("pause/", wrap(self.pause_view), name="{}_{}_pause".format(*info)),
            path("resume/", wrap(self.resume_view), name="{}_{}_resume".format(*info)),
            path("backfill/", wrap(self.backfill_view), name="{}_{}_backfill".format(*info)),
        ]

    def _require_view(self, request: HttpRequest) -> None:
        if not self.has_view_permission(request):
            raise PermissionDenied

    def _url(self, name: str) -> str:
        return reverse(f"{self.admin_site.name}:django_anarchon_scheduledjob_{name}")

    def _job_url(self, alias: str, job: str) -> str:
        return f"{self._url('history')}?{history_query(alias, job)}"

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None
                        ) -> HttpResponse:
        self._require_view(request)
        sections = collect_sections()
        can_run = request.user.has_perm(RUN_PERMISSION)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("Jobs"),
            "sections": sections,
            "can_run": can_run,
            "can_pause": request.user.has_perm(PAUSE_PERMISSION),
            "strip_length": STRIP_LENGTH,
            "pending_requests": pending_requests() if can_run else [],
            "history_admin": self.admin_site.is_registered(RunAttempt)
            and request.user.has_perm("django_anarchon.view_runattempt"),
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_anarchon/jobs.html", context)

    def _checked_post(self, request: HttpRequest, permission: str
                      ) -> tuple[str, str] | HttpResponse:
        """The scheduler and job a POST names, once the user may do it; or the answer."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not (self.has_view_permission(request) and request.user.has_perm(permission)):
            raise PermissionDenied
        alias = request.POST.get("scheduler", "")
        job = request.POST.get("job", "")
        changelist = HttpResponseRedirect(self._url("changelist"))
        if alias not in conf.get_config():
            messages.error(request, _("There is no scheduler %(alias)r.") % {"alias": alias})
            return changelist
        try:
            known = {info.name for info in scheduler_of(alias).jobs()}
        except Exception as exc:
            messages.error(request, f"{type(exc).__name__}: {redact_text(exc)}")
            return changelist
        if job not in known:
            messages.error(request, _("Scheduler %(alias)r has no job %(job)r.")
                           % {"alias": alias, "job": job})
            return changelist
        return alias, job

    def _back(self, request: HttpRequest, alias: str, job: str) -> HttpResponseRedirect:
        """Back to the page the form was on: the job's page or the Jobs page (no other)."""
        if request.POST.get("next") == "job":
            return HttpResponseRedirect(self._job_url(alias, job))
        return HttpResponseRedirect(self._url("changelist"))

    def run_view(self, request: HttpRequest) -> HttpResponse:
        checked = self._checked_post(request, RUN_PERMISSION)
        if isinstance(checked, HttpResponse):
            return checked
        alias, job = checked
        changelist = self._url("changelist")
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

    def pause_view(self, request: HttpRequest) -> HttpResponse:
        checked = self._checked_post(request, PAUSE_PERMISSION)
        if isinstance(checked, HttpResponse):
            return checked
        alias, job = checked
        try:
            state = actions.pause(scheduler_of(alias), job, actions.PauseForm(request.POST),
                                  by=request.user.get_username())
        except actions.Refused as exc:
            _failed(request, _("Pause of %(job)s refused: %(error)s"),
                    _("Pause of %(job)s not confirmed: %(error)s"), job, exc)
        else:
            history_cache.forget(alias, job)
            until = (_("until resumed") if state.until is None else _("until %(when)s") % {
                "when": format_when(ms_to_datetime(state.until))})
            messages.success(request, _("Paused: %(job)s skips its slots on every instance "
                                        "of scheduler %(alias)r %(until)s.")
                             % {"job": job, "alias": alias, "until": until})
        return self._back(request, alias, job)

    def resume_view(self, request: HttpRequest) -> HttpResponse:
        checked = self._checked_post(request, PAUSE_PERMISSION)
        if isinstance(checked, HttpResponse):
            return checked
        alias, job = checked
        try:
            state = actions.resume(scheduler_of(alias), job)
        except actions.Refused as exc:
            _failed(request, _("Resume of %(job)s refused: %(error)s"),
                    _("Resume of %(job)s not confirmed: %(error)s"), job, exc)
            return self._back(request, alias, job)
        history_cache.forget(alias, job)
        if state is None:
            messages.info(request, _("Not paused: %(job)s was not paused.") % {"job": job})
        else:
            messages.success(request, _("Resumed: %(job)s runs again from its next slot "
                                        "(paused %(pause)s).")
                             % {"job": job, "pause": pause_text(state)})
        return self._back(request, alias, job)

    def backfill_view(self, request: HttpRequest) -> HttpResponse:
        checked = self._checked_post(request, BACKFILL_PERMISSION)
        if isinstance(checked, HttpResponse):
            return checked
        alias, job = checked
        form = actions.BackfillForm(request.POST)
        dry_run = "file" not in request.POST  # the "Backfill" button; anything else looks
        try:
            plan = actions.backfill(scheduler_of(alias), job, form, dry_run=dry_run,
                                    by=request.user.get_username())
        except actions.Refused as exc:
            _failed(request, _("Backfill of %(job)s refused: %(error)s"),
                    _("Backfill of %(job)s not confirmed: %(error)s"), job, exc)
            return self._job_page(request, alias, job, form.data)
        values = {"job": job, "count": len(plan.slots), "ran": plan.already_ran,
                  "alias": alias, "id": plan.request_id}
        if dry_run:
            messages.info(request, ngettext(
                "Dry run: a backfill of %(job)s would run %(count)d slot (%(ran)d of the "
                "range ran already). Nothing was filed.",
                "Dry run: a backfill of %(job)s would run %(count)d slots (%(ran)d of the "
                "range ran already). Nothing was filed.", len(plan.slots)) % values)
            return self._job_page(request, alias, job, form.data, plan)
        if plan.request_id is None:
            messages.warning(request, _("Nothing to backfill: every slot of %(job)s in the "
                                        "range ran already (%(ran)d).") % values)
            return self._job_page(request, alias, job, form.data)
        history_cache.forget(alias, job)
        messages.success(request, ngettext(
            "Backfill filed: request #%(id)d, %(count)d slot of %(job)s; a worker of "
            "scheduler %(alias)r runs it.",
            "Backfill filed: request #%(id)d, %(count)d slots of %(job)s; a worker of "
            "scheduler %(alias)r runs them one at a time, oldest first.", len(plan.slots))
            % values)
        return HttpResponseRedirect(self._job_url(alias, job))

    def job_history_view(self, request: HttpRequest) -> HttpResponse:
        self._require_view(request)
        alias = request.GET.get("scheduler", "")
        job = request.GET.get("job")
        if job is None:
            raise Http404("the history link names no job")
        if alias not in conf.get_config():
            raise Http404(f"there is no scheduler {alias!r}")
        return self._job_page(request, alias, job, request.GET)

    def _job_page(self, request: HttpRequest, alias: str, job: str, values: Any,
                  plan: BackfillPlan | None = None) -> HttpResponse:
        """The per-job page; ``values``: the backfill form's (a refused or dry POST, or a
        timeline link's GET)."""
        can_pause = request.user.has_perm(PAUSE_PERMISSION)
        can_backfill = request.user.has_perm(BACKFILL_PERMISSION)
        span = parse_span(values.get("span"))
        page = read_job_page(alias, job, span, link_backfills=can_backfill)
        backfill = {
            "start": values.get("start", ""),
            "end": values.get("end", ""),
            "max": values.get("max", DEFAULT_BACKFILL_MAX),
            "overlap": values.get("overlap", "skip"),
        }
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": _("History of %(job)s") % {"job": job},
            "alias": alias,
            "job": job,
            "page": page,
            "rows": page.rows,
            "schedule": page.schedule,
            "policies": page.policies,
            "target": page.target,
            "upcoming": page.upcoming,
            "error": page.error,
            "can_run": request.user.has_perm(RUN_PERMISSION),
            "can_pause": can_pause and page.has_ledger,
            "can_backfill": can_backfill and page.has_ledger,
            "span": span,
            "spans": list(SPANS),
            "job_query": history_query(alias, job),
            "backfill": backfill,
            "plan": plan,
            "plan_slots": [format_when(ms_to_datetime(s)) for s in (plan.slots if plan else ())
                           ][:PLAN_LISTED],
            "plan_more": max(len(plan.slots) - PLAN_LISTED, 0) if plan else 0,
            "backfills": backfill_rows(alias, job) if page.job is not None else [],
            "backfill_admin": self.admin_site.is_registered(BackfillRequest)
            and request.user.has_perm("django_anarchon.view_backfillrequest"),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/django_anarchon/job_history.html", context)

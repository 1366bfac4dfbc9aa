"""Pause, resume and backfill from the admin: the forms, and the scheduler call behind them.

The views (admin.py) check the permissions, and Django's middleware the CSRF token;
here the POSTed values are parsed (a ``datetime-local`` in the current time zone, a
duration, a whole number) and handed to ``Scheduler.pause/resume/backfill``, in the
admin's read pool with a deadline, so a store that hangs cannot hold the request. Every
refusal, the form's or the scheduler's, comes back as one line for a message: no
traceback, store errors redacted.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from concurrent.futures import wait as wait_futures
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from django import forms
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from .admin_format import format_when
from .engine.operations import DEFAULT_BACKFILL_MAX, MAX_BACKFILL, MAX_NOTE, BackfillPlan
from .exceptions import ConfigurationError
from .redact import redact_text

if TYPE_CHECKING:
    from .backends.base import PauseState
    from .engine import Scheduler

__all__ = ["ACTION_TIMEOUT_S", "BackfillForm", "NoAnswer", "PauseForm", "Refused", "backfill", "pause",
           "resume"]

T = TypeVar("T")

#: How long an action waits for the store before it tells the operator to look again.
ACTION_TIMEOUT_S = 10.0
#: What a ``datetime-local`` input sends: to the minute, or to the second (``step=1``).
LOCAL_FORMATS = ["%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M"]
#: The longest line a message shows.
MESSAGE_LIMIT = 300


class Refused(Exception):
    """Why an action did not happen, in one line an operator reads."""


class NoAnswer(Refused):
    """The store did not answer within the deadline: the action may still land."""


def one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MESSAGE_LIMIT else line[: MESSAGE_LIMIT - 1] + "…"


def _value(value: object) -> str:
    if isinstance(value, datetime):
        return format_when(value)
    text = repr(value)
    return text if len(text) <= 60 else text[:59] + "…"


def refusal(exc: BaseException) -> str:
    """An error as a message: a scheduler's refusal names the option and the value (the
    message around it names the job); anything else its type and redacted text."""
    if isinstance(exc, ConfigurationError):
        text = exc.reason
        if exc.option is not None:
            text = f"{exc.option} = {_value(exc.value)}: {text}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return one_line(redact_text(text))


def form_refusal(form: forms.Form) -> str:
    """The first error of each field, as "field: error; field: error"."""
    parts = []
    for name, errors in form.errors.items():
        label = form.fields[name].label if name in form.fields else None
        prefix = f"{label or name}: " if name != "__all__" else ""
        parts.append(f"{prefix}{errors[0]}")
    return one_line("; ".join(parts))


def _call(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in the admin's pool, within ``ACTION_TIMEOUT_S``."""
    from .admin_jobs import history_cache

    future = history_cache.submit(functools.partial(fn, *args, **kwargs))
    done, _pending = wait_futures([future], timeout=ACTION_TIMEOUT_S)
    if not done:
        raise NoAnswer(_(
            "the store did not answer within %(seconds)ss; reload the page to see whether "
            "it took effect") % {"seconds": f"{ACTION_TIMEOUT_S:g}"})
    failure = future.exception()
    if failure is not None:
        raise Refused(refusal(failure)) from failure
    return future.result()


class PauseForm(forms.Form):
    note = forms.CharField(label=gettext_lazy("note"), required=False, max_length=MAX_NOTE)
    until = forms.DateTimeField(label=gettext_lazy("until"), required=False,
                                input_formats=LOCAL_FORMATS)
    duration = forms.CharField(label=gettext_lazy("for"), required=False, max_length=40)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("until") and data.get("duration"):
            raise forms.ValidationError(_("give an end time or a duration, not both"))
        return data


def pause(scheduler: Scheduler, job: str, form: PauseForm, by: str) -> PauseState:
    if not form.is_valid():
        raise Refused(form_refusal(form))
    data = form.cleaned_data
    until: object = data.get("until") or data.get("duration") or None
    return _call(scheduler.pause, job, note=data.get("note") or "", until=until, by=by[:150])


def resume(scheduler: Scheduler, job: str) -> PauseState | None:
    return _call(scheduler.resume, job)


class BackfillForm(forms.Form):
    start = forms.DateTimeField(label=gettext_lazy("from"), input_formats=LOCAL_FORMATS)
    end = forms.DateTimeField(label=gettext_lazy("to"), input_formats=LOCAL_FORMATS)
    max = forms.IntegerField(label=gettext_lazy("max"), min_value=1, max_value=MAX_BACKFILL,
                             required=False)
    overlap = forms.ChoiceField(
        label=gettext_lazy("overlap"), required=False,
        choices=[("skip", gettext_lazy("skip: wait for a run in progress")),
                 ("allow", gettext_lazy("allow: run beside it"))],
    )

    def clean(self) -> dict[str, Any]:
        """Left out: the scheduler's defaults (``max`` 100, ``overlap`` skip)."""
        data = super().clean() or {}
        if data.get("max") is None:
            data["max"] = DEFAULT_BACKFILL_MAX
        data["overlap"] = data.get("overlap") or "skip"
        return data


def backfill(scheduler: Scheduler, job: str, form: BackfillForm, *, dry_run: bool, by: str
             ) -> BackfillPlan:
    if not form.is_valid():
        raise Refused(form_refusal(form))
    data = form.cleaned_data
    return _call(scheduler.backfill, job, data["start"], data["end"], max=data["max"],
                 overlap=data["overlap"], dry_run=dry_run, requested_by=by[:150])

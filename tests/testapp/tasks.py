"""django.tasks Tasks for tests/test_tasks.py (enqueued there, never run: no worker)."""

from __future__ import annotations

from typing import Any

try:  # Django 6
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task  # type: ignore[no-redef]


@task()
def report(job: str, slot: int, scheduled_at: str, reason: str, attempt: int, data: Any) -> None:
    """Takes every slot argument."""


@task()
def just_slot(slot: int, **kwargs: Any) -> None:
    """``**kwargs``: every slot argument."""


@task(takes_context=True)
def with_context(context: Any, job: str, slot: int) -> None:
    """django.tasks' own context first; the slot's arguments after it."""


@task()
def needs_user(user_id: int, job: str = "") -> None:
    """Requires an argument no slot gives."""


@task()
def bare() -> None:
    """Takes nothing: enqueued with no arguments (and cannot be found by its slot)."""


@task()
def traced(job: str, slot: int, trace: dict[str, str]) -> None:
    """Takes the attempt's trace context (tests/test_otel.py)."""

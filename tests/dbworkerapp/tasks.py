"""The task the ``tasks`` scenario's job enqueues once per slot; run by django-tasks-db's worker.

Each run of it writes an ``Execution`` (note ``task``), so the test counts how often each
slot's task really ran, apart from what the scheduler and the task queue recorded.
"""

from __future__ import annotations

try:  # Django 6
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task  # type: ignore[no-redef]


@task()
def beat_task(job: str, slot: int, attempt: int, reason: str) -> None:
    from .models import Execution

    Execution._default_manager.create(
        job=job, slot=slot, instance_id="task", attempt=attempt, note=f"task {reason}"
    )

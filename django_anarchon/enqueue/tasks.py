"""django.tasks as a job's target: Django 6's ``django.tasks`` or the ``django-tasks`` backport.

The enqueue is ``task.enqueue(**slot_kwargs)``. What else the target can say depends on the
task's backend: django-tasks-db's ``DatabaseBackend`` writes the task row with the ORM on
the database its router picks for ``DBTaskResult``, inside whatever transaction is open
there. That is what lets the database backend of this app commit the enqueue and the run's
finish together (``database_alias``), and lets a takeover search for a task already
enqueued for a slot (``find``), when the task takes ``job`` and ``slot``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from django.db import router

from .base import accepted_arguments

#: The task backend whose rows this target can read and share a transaction with.
DB_BACKEND_CLASS = "django_tasks_db.backend.DatabaseBackend"


class DjangoTaskTarget:
    """A ``django.tasks`` Task (``@task()``) enqueued once per slot."""

    kind = "django.tasks"

    def __init__(self, task: Any) -> None:
        self.task = task

    def describe(self) -> str:
        return f"django.tasks {self.task.module_path} ({self.task.backend})"

    def function(self) -> Callable[..., Any]:
        """The task's function; with ``takes_context`` its first argument is django's, not ours."""
        func: Callable[..., Any] = self.task.func
        return functools.partial(func, None) if self.task.takes_context else func

    def _db_result_model(self) -> Any:
        """django-tasks-db's ``DBTaskResult`` if the task's backend is its database backend."""
        backend = self.task.get_backend()
        if f"{type(backend).__module__}.{type(backend).__qualname__}" != DB_BACKEND_CLASS:
            return None
        from django_tasks_db.models import DBTaskResult

        return DBTaskResult

    def find(self, job: str, slot: int) -> str | None:
        """The task django-tasks-db holds for (job, slot), read from its arguments.

        Only a task that takes both ``job`` and ``slot`` can be found; any other backend
        (or task) answers ``None``.
        """
        model = self._db_result_model()
        accepted = accepted_arguments(self.function())
        if model is None or "job" not in accepted or "slot" not in accepted:
            return None
        found = (
            model.objects.using(router.db_for_write(model) or "default")
            .filter(
                task_path=self.task.module_path,
                backend_name=self.task.backend,
                args_kwargs__kwargs__job=job,
                args_kwargs__kwargs__slot=slot,
            )
            .values_list("id", flat=True)
            .first()
        )
        return None if found is None else str(found)

    def enqueue(self, job: str, slot: int, kwargs: Mapping[str, Any]) -> str:
        return str(self.task.enqueue(**kwargs).id)

    def database_alias(self) -> str | None:
        model = self._db_result_model()
        return None if model is None else (router.db_for_write(model) or "default")

    @property
    def admin_url_name(self) -> str | None:
        """The admin page of a task result (django-tasks-db's), for the history's links."""
        if self._db_result_model() is None:
            return None
        return "admin:django_tasks_database_dbtaskresult_change"

    def result(self, task_id: str) -> Any:
        """The task's result (status, times), where its backend can say it; else ``None``."""
        backend = self.task.get_backend()
        if not getattr(backend, "supports_get_result", False):
            return None
        try:
            return backend.get_result(task_id)
        except Exception:  # gone (pruned) or unreadable: the id is all there is
            return None

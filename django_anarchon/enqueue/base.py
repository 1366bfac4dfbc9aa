"""What a task system offers the beat: look for a slot's task, enqueue it, say where.

The beat (``run``) enqueues a slot's task at most once per (job, slot): before an
enqueue it asks the target whether the slot's task is already there (a takeover after a
runner died between its enqueue and its finish must not enqueue again). ``find`` is the
target's own knowledge of that (a task id derived from the slot, a query of its queue);
``database_alias`` names the database its enqueue writes to, when it writes to one, so
that the database backend can commit the enqueue and the run's finish together.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..exceptions import ConfigurationError

if TYPE_CHECKING:
    from ..engine.context import JobContext

#: The keyword arguments a task may take from its slot: a task receives those its
#: function names (all of them if it takes ``**kwargs``). ``trace`` is the attempt's
#: trace context (``contrib.otel.inject_context()``: empty without OpenTelemetry).
SLOT_ARGUMENTS = ("job", "slot", "scheduled_at", "reason", "attempt", "data", "trace")


@runtime_checkable
class TaskTarget(Protocol):
    """One task of one task system, as a job's target."""

    #: The task system: ``"django.tasks"`` or ``"celery"``.
    kind: str

    def describe(self) -> str:
        """The task for listings, e.g. ``django.tasks myapp.tasks.send_report (default)``."""
        ...

    def function(self) -> Callable[..., Any]:
        """The task's Python function, whose signature decides which slot arguments it gets."""
        ...

    def find(self, job: str, slot: int) -> str | None:
        """The id of the task already enqueued for (job, slot), or ``None`` if there is none."""
        ...

    def enqueue(self, job: str, slot: int, kwargs: Mapping[str, Any]) -> str:
        """Enqueue the task with ``kwargs``; return its id."""
        ...

    def database_alias(self) -> str | None:
        """The Django database the enqueue writes to, if it writes to one in a transaction."""
        ...


def accepted_arguments(function: Callable[..., Any]) -> tuple[str, ...]:
    """Which of :data:`SLOT_ARGUMENTS` ``function`` takes (all of them with ``**kwargs``)."""
    parameters = inspect.signature(function).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return SLOT_ARGUMENTS
    names = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return tuple(a for a in SLOT_ARGUMENTS if a in names)


def slot_kwargs(ctx: JobContext, accepted: tuple[str, ...]) -> dict[str, Any]:
    """The JSON-able slot arguments for a task that takes ``accepted``."""
    from ..contrib.otel import inject_context

    values: dict[str, Any] = {
        "job": ctx.name,
        "slot": ctx.slot,
        "scheduled_at": ctx.scheduled_at.isoformat(),
        "reason": ctx.reason,
        "attempt": ctx.attempt,
        "data": ctx.data,
        "trace": inject_context() if "trace" in accepted else {},
    }
    return {name: values[name] for name in accepted}


#: The modules whose ``Task`` class is a django.tasks Task: Django 6's, and the backport's.
DJANGO_TASK_MODULES = ("django.tasks.base", "django_tasks.base")
#: Where the Celery target lives (its own extra, ``[celery]``).
CELERY_MODULE = "django_anarchon.enqueue.celery"


def target_for(obj: object) -> TaskTarget | None:
    """The task target ``obj`` names (a django.tasks Task, a Celery task, a TaskTarget), or None.

    Only task systems already imported are asked: an object cannot be a task of a module
    nobody imported, and a plain handler costs no import.
    """
    if isinstance(obj, TaskTarget):
        return obj
    for name in DJANGO_TASK_MODULES:
        module = sys.modules.get(name)
        task_class = getattr(module, "Task", None)
        if isinstance(task_class, type) and isinstance(obj, task_class):
            from .tasks import DjangoTaskTarget

            return DjangoTaskTarget(obj)
    if "celery" in sys.modules:
        try:
            celery = importlib.import_module(CELERY_MODULE)
        except ModuleNotFoundError as exc:
            if exc.name != CELERY_MODULE:
                raise
            return None
        found: TaskTarget | None = celery.maybe_target(obj)
        return found
    return None


def check_target(job: str, target: TaskTarget) -> tuple[str, ...]:
    """Refuse a task that needs an argument the slot cannot give; return those it takes."""
    try:
        parameters = inspect.signature(target.function()).parameters.values()
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"cannot read the task function's signature ({exc})",
            job=job, option="handler", value=target.describe(),
        ) from None
    for p in parameters:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.default is not p.empty:
            continue
        if p.kind is p.POSITIONAL_ONLY or p.name not in SLOT_ARGUMENTS:
            raise ConfigurationError(
                f"the task's function requires the argument {p.name!r}, which the beat cannot "
                f"give: a task receives only keyword arguments among {', '.join(SLOT_ARGUMENTS)} "
                "(give the others a default)",
                job=job, option="handler", value=target.describe(),
            )
    return accepted_arguments(target.function())

"""The decorators (``every``, ``cron``, ``at``, ``scheduled``) and the registry they fill.

Decorators run while ``jobs.py`` modules are imported, long before any scheduler or
backend exists, so they only validate and record. A scheduler built from settings
later takes the jobs recorded for its alias (``jobs_for``). Validation happens at
decoration time so a bad option fails at import, naming the job, option and value.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, overload

from .conf import DEFAULT_ALIAS
from .exceptions import ConfigurationError, DuplicateJobError
from .jobs import JobKind, build_job

if TYPE_CHECKING:
    from .engine import Scheduler

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", bound=type)


@dataclass(frozen=True)
class JobSpec:
    """One decorated job, as recorded before any scheduler exists."""

    name: str | None
    kind: JobKind
    spec: Any
    options: Mapping[str, Any] = field(default_factory=dict)
    origin: str = ""


@dataclass(frozen=True)
class FunctionJob:
    """A decorated module-level function, bound for one scheduler alias."""

    name: str
    job: JobSpec
    handler: Callable[..., Any]


@dataclass(frozen=True)
class ClassJobs:
    """A ``@scheduled`` class: instantiated once with no arguments when its scheduler is built."""

    cls: type
    prefix: str
    defaults: Mapping[str, Any]
    origin: str


def _origin(obj: object) -> str:
    """``module:line`` of a function or class, for error messages naming both duplicates."""
    target = inspect.unwrap(obj) if callable(obj) else obj
    module = getattr(target, "__module__", "?")
    try:
        line = inspect.getsourcelines(target)[1]  # type: ignore[arg-type]
    except (OSError, TypeError):
        return f"{module}.{getattr(target, '__qualname__', '?')}"
    return f"{module}:{line} ({getattr(target, '__qualname__', '?')})"


def app_label_for(module: str) -> str:
    """The label of the installed app containing ``module``, else the module minus ``.jobs``."""
    from django.apps import apps

    if apps.apps_ready:
        config = apps.get_containing_app_config(module)
        if config is not None:
            return config.label
    return module.removesuffix(".jobs")


def _is_method(fn: Callable[..., Any]) -> bool:
    """A function defined in a class body (``Cls.fn``), not a nested function (``f.<locals>.g``)."""
    parts = getattr(fn, "__qualname__", "").split(".")
    return len(parts) > 1 and parts[-2] != "<locals>"


class Registry:
    """Jobs declared with the decorators, per scheduler alias."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._functions: dict[str, dict[str, FunctionJob]] = {}
        self._classes: dict[str, dict[str, ClassJobs]] = {}
        self._names: dict[str, dict[str, str]] = {}  # alias -> job name -> origin

    def _claim_name(self, alias: str, name: str, origin: str) -> bool:
        """Reserve ``name``; ``False`` when the same place registers again (a module re-import)."""
        names = self._names.setdefault(alias, {})
        previous = names.get(name)
        if previous is not None:
            if previous == origin:
                return False
            raise DuplicateJobError(
                f"already defined at {previous}; defined again at {origin}. "
                "Give one of them another name with name=...",
                job=name,
            )
        names[name] = origin
        return True

    def add_function(self, alias: str, name: str, spec: JobSpec, handler: Callable[..., Any]) -> None:
        with self._lock:
            self._claim_name(alias, name, spec.origin)
            self._functions.setdefault(alias, {})[name] = FunctionJob(name, spec, handler)

    def add_class(self, alias: str, entry: ClassJobs, names: list[tuple[str, str]]) -> None:
        with self._lock:
            for name, origin in names:
                self._claim_name(alias, name, origin)
            self._classes.setdefault(alias, {})[entry.prefix] = entry

    def aliases(self) -> set[str]:
        return set(self._functions) | set(self._classes)

    def functions_for(self, alias: str) -> list[FunctionJob]:
        return list(self._functions.get(alias, {}).values())

    def classes_for(self, alias: str) -> list[ClassJobs]:
        return list(self._classes.get(alias, {}).values())

    def install(self, scheduler: Scheduler, alias: str) -> None:
        """Register every job recorded for ``alias`` on ``scheduler``."""
        for entry in self.functions_for(alias):
            spec = entry.job
            _register_spec(scheduler, entry.name, spec, entry.handler)
        for cls_entry in self.classes_for(alias):
            scheduler.register(cls_entry.cls(), prefix=cls_entry.prefix, defaults=dict(cls_entry.defaults))

    def forget(self, alias: str) -> None:
        """Forget the jobs recorded for ``alias`` (tests that declare jobs of their own)."""
        with self._lock:
            self._functions.pop(alias, None)
            self._classes.pop(alias, None)
            self._names.pop(alias, None)


registry = Registry()


def _register_spec(
    scheduler: Scheduler, name: str, spec: JobSpec, handler: Callable[..., Any]
) -> None:
    options = dict(spec.options)
    if spec.kind == "every":
        scheduler.every(name, spec.spec, handler, **options)
    elif spec.kind == "cron":
        scheduler.cron(name, spec.spec, handler, **options)
    else:
        scheduler.at(name, spec.spec, handler, **options)


def _job_decorator(
    kind: JobKind,
    spec: Any,
    name: str | None,
    scheduler: str | Scheduler | None,
    options: dict[str, Any],
) -> Callable[[F], F]:
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise ConfigurationError("a job name must be a non-empty string", option="name", value=name)
    if scheduler is not None and not isinstance(scheduler, str) and not hasattr(scheduler, "every"):
        raise ConfigurationError(
            "expected a scheduler alias from settings.ANARCHON or a Scheduler",
            job=name, option="scheduler", value=scheduler,
        )

    def decorate(fn: F) -> F:
        if not callable(fn):
            raise ConfigurationError("decorate a function or method", job=name, option="handler", value=fn)
        origin = _origin(fn)
        job_spec = JobSpec(name=name, kind=kind, spec=spec, options=dict(options), origin=origin)
        if _is_method(fn):
            # A method: the @scheduled class (or Scheduler.register) names and binds it later.
            if scheduler is not None:
                raise ConfigurationError(
                    "choose the scheduler of a method job on @scheduled(scheduler=...)",
                    job=name or fn.__name__, option="scheduler", value=scheduler,
                )
            _validate(name or fn.__name__, job_spec, fn)
            specs: list[JobSpec] = list(getattr(fn, "_anarchon_jobs", []))
            specs.append(job_spec)
            fn._anarchon_jobs = specs  # type: ignore[attr-defined]
            return fn
        full_name = name or f"{app_label_for(fn.__module__)}.{fn.__name__}"
        if scheduler is not None and not isinstance(scheduler, str):
            _register_spec(scheduler, full_name, job_spec, fn)
            return fn
        _validate(full_name, job_spec, fn)
        registry.add_function(scheduler or DEFAULT_ALIAS, full_name, job_spec, fn)
        return fn

    return decorate


def _validate(name: str, spec: JobSpec, handler: Callable[..., Any]) -> None:
    """Fail at import on bad options; settings-dependent checks happen when the scheduler is built."""
    options = dict(spec.options)
    build_job(name, spec.kind, spec.spec, handler, options, origin=spec.origin)


def every(
    interval: Any, *, name: str | None = None, scheduler: str | Scheduler | None = None, **options: Any
) -> Callable[[F], F]:
    """Run the decorated function every ``interval`` ("10s", timedelta, seconds)."""
    return _job_decorator("every", interval, name, scheduler, options)


def cron(
    expression: str,
    *,
    timezone: str | None = None,
    name: str | None = None,
    scheduler: str | Scheduler | None = None,
    **options: Any,
) -> Callable[[F], F]:
    """Run the decorated function on a cron expression, in ``timezone`` (default TIME_ZONE)."""
    if timezone is not None:
        options["timezone"] = timezone
    return _job_decorator("cron", expression, name, scheduler, options)


def at(
    when: Any, *, name: str | None = None, scheduler: str | Scheduler | None = None, **options: Any
) -> Callable[[F], F]:
    """Run the decorated function once, at ``when`` (an aware datetime or ISO 8601 string)."""
    return _job_decorator("once", when, name, scheduler, options)


@overload
def scheduled(cls: C, /) -> C: ...


@overload
def scheduled(
    *,
    prefix: str | None = None,
    scheduler: str | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> Callable[[C], C]: ...


def scheduled(
    cls: C | None = None,
    /,
    *,
    prefix: str | None = None,
    scheduler: str | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> C | Callable[[C], C]:
    """Register the job methods of a class; its jobs are named ``prefix.method``.

    The class is instantiated once, with no arguments, when its scheduler is built. A
    class that needs constructor arguments is registered with ``Scheduler.register(obj)``.
    """
    if scheduler is not None and not isinstance(scheduler, str):
        raise ConfigurationError(
            "expected a scheduler alias from settings.ANARCHON", option="scheduler", value=scheduler
        )

    def decorate(klass: C) -> C:
        if not inspect.isclass(klass):
            raise ConfigurationError("@scheduled decorates a class", option="scheduled", value=klass)
        the_prefix = prefix or f"{app_label_for(klass.__module__)}.{klass.__name__}"
        names: list[tuple[str, str]] = []
        for attr, value in inspect.getmembers(klass, callable):
            for spec in getattr(value, "_anarchon_jobs", []):
                job_name = f"{the_prefix}.{spec.name or attr}"
                if defaults:
                    build_job(job_name, spec.kind, spec.spec, value, {**defaults, **spec.options},
                              origin=spec.origin)
                names.append((job_name, spec.origin))
        if not names:
            raise ConfigurationError(
                "the class has no methods decorated with @every, @cron or @at",
                option="scheduled", value=klass.__qualname__,
            )
        entry = ClassJobs(cls=klass, prefix=the_prefix, defaults=dict(defaults or {}),
                          origin=_origin(klass))
        registry.add_class(scheduler or DEFAULT_ALIAS, entry, names)
        return klass

    if cls is not None:
        return decorate(cls)
    return decorate

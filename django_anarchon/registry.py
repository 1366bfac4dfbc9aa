"""The decorators (``every``, ``cron``, ``at``, ``scheduled``) and the registry they fill.

Decorators run while ``jobs.py`` modules are imported, long before any scheduler or
backend exists, so they only validate and record. A scheduler built from settings
later takes the jobs recorded for its alias (``jobs_for``). Validation happens at
decoration time, naming the job, option and value. During autodiscovery (inside
``django.setup()``) an invalid job is kept as a registration error instead of raised, as
Django does with model mistakes: setup succeeds, so the web process and the shell work,
``manage.py check`` reports it (anarchon.E004), and the worker stops with the whole list
(``migrate`` does not: a job takes no part in the schema).
Anywhere else (a test, a shell, a module imported later) the decorator raises at once.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, overload

from .conf import DEFAULT_ALIAS
from .enqueue.base import target_for
from .exceptions import ConfigurationError, DuplicateJobError
from .jobs import JobKind, build_job

if TYPE_CHECKING:
    from .engine import Scheduler

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", bound=type)

logger = logging.getLogger("django_anarchon")

#: True while autodiscovery imports the ``jobs.py`` modules (see ``Registry.collecting``).
_collecting: ContextVar[bool] = ContextVar("django_anarchon_collecting", default=False)


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


@dataclass(frozen=True)
class RegistrationError:
    """A decorator's error kept during autodiscovery; ``manage.py check`` reports it."""

    error: ConfigurationError
    #: ``module:line (qualname)`` of the decorated function or class.
    origin: str
    #: The scheduler alias the job was meant for, when the decorator named one.
    alias: str | None


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
        self._errors: list[RegistrationError] = []

    @contextmanager
    def collecting(self) -> Iterator[None]:
        """Keep decorator errors raised inside the block instead of raising them."""
        token = _collecting.set(True)
        try:
            yield
        finally:
            _collecting.reset(token)

    def keep(self, error: ConfigurationError, origin: str, alias: str | None) -> bool:
        """Keep ``error`` when collecting and say so; ``False`` means the caller raises it."""
        if not _collecting.get():
            return False
        with self._lock:
            self._errors.append(RegistrationError(error, origin, alias))
        return True

    def errors(self) -> list[RegistrationError]:
        """Registration errors kept during autodiscovery, in the order they happened."""
        return list(self._errors)

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
        """Register every job recorded for ``alias`` on ``scheduler``.

        Jobs kept as registration errors are not there: each is logged, and the system
        checks (which the worker runs before it starts) report it as an error.
        """
        for kept in self._errors:
            if kept.alias in (alias, None):
                logger.error("scheduler %r runs without a job that failed to register: %s "
                             "(defined at %s)", alias, kept.error, kept.origin)
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
            self._errors = [kept for kept in self._errors if kept.alias != alias]


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


def _alias_of(scheduler: object) -> str | None:
    """The alias a decorator's job belongs to; ``None`` for a Scheduler object."""
    if scheduler is None:
        return DEFAULT_ALIAS
    return scheduler if isinstance(scheduler, str) else None


def _kept_later(error: ConfigurationError, alias: str | None) -> Callable[[F], F]:
    """A decorator argument was wrong: raise now, or (collecting) keep it once ``fn`` is known."""
    if not _collecting.get():
        raise error

    def keep(fn: F) -> F:
        registry.keep(error, _origin(fn), alias)
        return fn

    return keep


def _job_decorator(
    kind: JobKind,
    spec: Any,
    name: str | None,
    scheduler: str | Scheduler | None,
    options: dict[str, Any],
) -> Callable[[F], F]:
    try:
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise ConfigurationError("a job name must be a non-empty string", option="name",
                                     value=name)
        if (scheduler is not None and not isinstance(scheduler, str)
                and not hasattr(scheduler, "every")):
            raise ConfigurationError(
                "expected a scheduler alias from settings.ANARCHON or a Scheduler",
                job=name, option="scheduler", value=scheduler,
            )
    except ConfigurationError as exc:
        return _kept_later(exc, _alias_of(scheduler))

    def decorate(fn: F) -> F:
        try:
            return _decorate(kind, spec, name, scheduler, options, fn)
        except ConfigurationError as exc:
            if not registry.keep(exc, _origin(fn), _alias_of(scheduler)):
                raise
            if callable(fn):
                # A @scheduled class must not then also say it has no job methods.
                fn._anarchon_invalid = True  # type: ignore[attr-defined]
            return fn

    return decorate


def _decorate(
    kind: JobKind,
    spec: Any,
    name: str | None,
    scheduler: str | Scheduler | None,
    options: dict[str, Any],
    fn: F,
) -> F:
    """Validate and record one decorated function (the body of every job decorator)."""
    target = target_for(fn)
    if target is None and not callable(fn):
        raise ConfigurationError("decorate a function or method", job=name, option="handler", value=fn)
    # A task (``@every`` over ``@task()``) is named and located by its function.
    function = target.function() if target is not None else fn
    named: Any = getattr(function, "func", function)  # functools.partial: takes_context
    origin = _origin(named)
    job_spec = JobSpec(name=name, kind=kind, spec=spec, options=dict(options), origin=origin)
    if target is None and _is_method(fn):
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
    full_name = name or f"{app_label_for(named.__module__)}.{named.__name__}"
    if scheduler is not None and not isinstance(scheduler, str):
        _register_spec(scheduler, full_name, job_spec, fn)
        return fn
    _validate(full_name, job_spec, fn)
    registry.add_function(scheduler or DEFAULT_ALIAS, full_name, job_spec, fn)
    return fn


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
        error = ConfigurationError(
            "expected a scheduler alias from settings.ANARCHON", option="scheduler", value=scheduler
        )
        kept: Callable[[C], C] = _kept_later(error, None)
        return kept(cls) if cls is not None else kept

    def decorate(klass: C) -> C:
        try:
            _decorate_class(klass, prefix, scheduler or DEFAULT_ALIAS, defaults)
        except ConfigurationError as exc:
            if not registry.keep(exc, _origin(klass), scheduler or DEFAULT_ALIAS):
                raise
        return klass

    if cls is not None:
        return decorate(cls)
    return decorate


def _decorate_class(
    klass: type, prefix: str | None, alias: str, defaults: Mapping[str, Any] | None
) -> None:
    """Validate and record a ``@scheduled`` class's job methods."""
    if not inspect.isclass(klass):
        raise ConfigurationError("@scheduled decorates a class", option="scheduled", value=klass)
    the_prefix = prefix or f"{app_label_for(klass.__module__)}.{klass.__name__}"
    names: list[tuple[str, str]] = []
    invalid = False
    for attr, value in inspect.getmembers(klass, callable):
        invalid = invalid or getattr(value, "_anarchon_invalid", False)
        for spec in getattr(value, "_anarchon_jobs", []):
            job_name = f"{the_prefix}.{spec.name or attr}"
            if defaults:
                build_job(job_name, spec.kind, spec.spec, value, {**defaults, **spec.options},
                          origin=spec.origin)
            names.append((job_name, spec.origin))
    if not names:
        if invalid:
            return  # its only job methods failed, and their errors are kept
        raise ConfigurationError(
            "the class has no methods decorated with @every, @cron or @at",
            option="scheduled", value=klass.__qualname__,
        )
    entry = ClassJobs(cls=klass, prefix=the_prefix, defaults=dict(defaults or {}),
                      origin=_origin(klass))
    registry.add_class(alias, entry, names)

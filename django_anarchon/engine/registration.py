"""Registration: a scheduler's jobs, defined by ``every``/``cron``/``at`` (or their
decorators), ``register`` and ``add_job``, each checked before it is added.

A mixin of ``Scheduler``: what is checked here is what can be known before any store is
asked (duplicate names, options the backend cannot honour, the backend's own limits), so
a mistake fails at import time, naming the job, the option and the value. A job added
while the scheduler runs is armed at once (``_arm_new``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, overload

from ..backends.base import JobInfo, ms_to_datetime
from ..exceptions import ConfigurationError, DuplicateJobError, UnknownJobError
from ..jobs import Handler, Job, JobKind, JobOptions, build_job, check_dedupe_window

if TYPE_CHECKING:
    from ..backends.base import Backend, BaseBackend
    from .clock import StoreClock
    from .runner import Attempt
    from .timer import Timer

__all__ = ["JobSpecLike", "JobState", "RegistrationMixin"]

logger = logging.getLogger("django_anarchon")

H = TypeVar("H", bound=Callable[..., Any])


class JobSpecLike(Protocol):
    """What ``register()`` reads from a decorated method's ``_anarchon_jobs`` entries."""

    @property
    def name(self) -> str | None: ...
    @property
    def kind(self) -> Literal["every", "cron", "once"]: ...
    @property
    def spec(self) -> Any: ...
    @property
    def options(self) -> Mapping[str, Any]: ...
    @property
    def origin(self) -> str: ...


@dataclass
class JobState:
    """A registered job and where the scheduler's timer stands with it."""

    job: Job
    #: The slot the timer is set for (``None``: nothing more to run).
    next_slot: int | None = None


def _origin(handler: object) -> str:
    module = getattr(handler, "__module__", None) or "?"
    qualname = getattr(handler, "__qualname__", None) or type(handler).__qualname__
    # A function's first line is on its code object; ``getsourcelines`` finds the same
    # line by tokenizing the file, 0.1 ms per job (1.3 s of registering 10,000 jobs).
    code = getattr(inspect.unwrap(handler) if callable(handler) else handler, "__code__", None)
    if isinstance(code, types.CodeType):
        return f"{module}.{qualname} (line {code.co_firstlineno})"
    try:
        line = inspect.getsourcelines(handler)[1]  # type: ignore[arg-type]
        return f"{module}.{qualname} (line {line})"
    except (OSError, TypeError):
        return f"{module}.{qualname}"


class RegistrationMixin:
    """The jobs of a ``Scheduler``: defined, checked, listed and forgotten."""

    name: str
    backend: Backend | BaseBackend
    job_defaults: JobOptions
    default_timezone: str
    clock: StoreClock
    _jobs: dict[str, JobState]
    _running: bool
    _loop: asyncio.AbstractEventLoop | None
    _timer: Timer | None
    _attempts: set[Attempt]

    if TYPE_CHECKING:
        def _arm_new(self, state: JobState) -> None: ...
        def _initial_slot(self, job: Job, now: int) -> int | None: ...

    @overload
    def every(
        self, name: str, interval: object, handler: None = None, **options: Any
    ) -> Callable[[H], H]: ...
    @overload
    def every(self, name: str, interval: object, handler: Handler, **options: Any) -> Job: ...
    def every(
        self, name: str, interval: object, handler: Handler | None = None, **options: Any
    ) -> Job | Callable[[H], H]:
        """Run ``handler`` every ``interval``; without a handler, return a decorator."""
        return self._define(name, "every", interval, handler, options)

    @overload
    def cron(
        self,
        name: str,
        expression: str,
        handler: None = None,
        timezone: str | None = None,
        **options: Any,
    ) -> Callable[[H], H]: ...
    @overload
    def cron(
        self,
        name: str,
        expression: str,
        handler: Handler,
        timezone: str | None = None,
        **options: Any,
    ) -> Job: ...
    def cron(
        self,
        name: str,
        expression: str,
        handler: Handler | None = None,
        timezone: str | None = None,
        **options: Any,
    ) -> Job | Callable[[H], H]:
        """Run ``handler`` on a cron expression in ``timezone`` (default: the scheduler's)."""
        if timezone is not None:
            options["timezone"] = timezone
        return self._define(name, "cron", expression, handler, options)

    @overload
    def at(
        self, name: str, when: object, handler: None = None, **options: Any
    ) -> Callable[[H], H]: ...
    @overload
    def at(self, name: str, when: object, handler: Handler, **options: Any) -> Job: ...
    def at(
        self, name: str, when: object, handler: Handler | None = None, **options: Any
    ) -> Job | Callable[[H], H]:
        """Run ``handler`` once at ``when`` (an aware datetime or an ISO 8601 string)."""
        return self._define(name, "once", when, handler, options)

    def _define(
        self,
        name: str,
        kind: JobKind,
        spec: object,
        handler: Handler | None,
        options: dict[str, Any],
    ) -> Job | Callable[[H], H]:
        if handler is None:

            def decorator(fn: H) -> H:
                self._define(name, kind, spec, fn, options)
                return fn

            return decorator
        job = build_job(
            name,
            kind,
            spec,
            handler,
            options,
            defaults=self.job_defaults,
            default_timezone=self.default_timezone,
            origin=_origin(handler),
        )
        self._check(job, options)
        return self._add(job)

    def register(
        self, obj: object, prefix: str | None = None, defaults: Mapping[str, Any] | None = None
    ) -> list[Job]:
        """Register the decorated methods of ``obj`` as ``{prefix}.{name}`` jobs.

        ``prefix`` defaults to the class name; ``defaults`` are options under each
        method's own. All of the object's jobs are validated before any is added.
        """
        cls = type(obj)
        prefix = cls.__name__ if prefix is None else prefix
        built: list[tuple[Job, dict[str, Any]]] = []
        for attr in dir(cls):
            specs: Iterable[JobSpecLike] = getattr(getattr(cls, attr, None), "_anarchon_jobs", ())
            for spec in specs:
                options = {**(defaults or {}), **spec.options}
                options.pop("name", None)
                options.pop("scheduler", None)
                job_name = f"{prefix}.{spec.name or attr}" if prefix else (spec.name or attr)
                job = build_job(
                    job_name,
                    spec.kind,
                    spec.spec,
                    getattr(obj, attr),
                    options,
                    defaults=self.job_defaults,
                    default_timezone=self.default_timezone,
                    origin=spec.origin or _origin(getattr(cls, attr)),
                )
                self._check(job, options)
                built.append((job, options))
        names = [job.name for job, _ in built]
        for job, _ in built:
            if names.count(job.name) > 1:
                raise DuplicateJobError(
                    f"defined twice in {cls.__qualname__}",
                    job=job.name,
                    option="name",
                    value=job.name,
                )
        return [self._add(job) for job, _ in built]

    def add_job(self, job: Job) -> Job:
        """Register a prebuilt :class:`~django_anarchon.jobs.Job` (options already validated)."""
        self._check(job, {})
        return self._add(job)

    def _check(self, job: Job, given: Mapping[str, Any]) -> None:
        existing = self._jobs.get(job.name)
        if existing is not None:
            raise DuplicateJobError(
                f"already registered on scheduler {self.name!r} by {existing.job.origin or '?'}; "
                f"registered again by {job.origin or '?'}",
                job=job.name,
                option="name",
                value=job.name,
            )
        options = job.options
        if getattr(self.backend, "runs", None) is None and options.lease_options_asked:
            option = sorted(options.lease_options_asked)[0]
            value = given.get(
                option,
                {
                    "overlap": options.overlap,
                    "max_attempts": options.max_attempts,
                    "catch_up": options.catch_up_ms,
                    "catch_up_mode": options.catch_up_mode,
                    "catch_up_limit": options.catch_up_limit,
                    "buffer_limit": options.buffer_limit,
                }.get(option),
            )
            raise ConfigurationError(
                f"needs a backend with leases; the {self.backend.name} backend has none",
                job=job.name,
                option=option,
                value=value,
            )
        check_dedupe_window(job, self.backend.dedupe_window_ms, self.backend.name)
        check_job = getattr(self.backend, "check_job", None)
        if callable(check_job):
            check_job(job.limits())
        if job.is_expired():
            logger.warning(
                "scheduler %s: one-off job %s was due at %s, longer ago than catch_up + max_late; "
                "it is registered but will not run",
                self.name,
                job.name,
                job.schedule.describe(),
            )

    def _add(self, job: Job) -> Job:
        state = JobState(job)
        self._jobs[job.name] = state
        if self._running and self._loop is not None:
            self._loop.call_soon_threadsafe(self._arm_new, state)
        return job

    def unregister(self, name: str) -> None:
        """Forget a job; its runs in flight here finish normally."""
        self._state(name)
        del self._jobs[name]
        if self._timer is not None:
            self._timer.cancel(name)

    def jobs(self) -> list[JobInfo]:
        now = self.clock.now()
        infos = []
        for state in self._jobs.values():
            job = state.job
            if self._running:
                slot = state.next_slot
            else:
                slot = None if job.is_expired(now) else self._initial_slot(job, now)
            options = {
                k: v
                for k, v in asdict(job.options).items()
                if k not in ("data", "lease_options_asked")
            }
            infos.append(
                JobInfo(
                    name=job.name,
                    type=job.kind,
                    schedule=job.schedule.describe(),
                    next_run_at=None if slot is None else ms_to_datetime(slot),
                    running_here=sum(1 for a in list(self._attempts) if a.job.name == job.name),
                    options=options,
                )
            )
        return infos

    def get_job(self, name: str) -> Job:
        return self._state(name).job

    def registered_jobs(self) -> list[Job]:
        return [state.job for state in self._jobs.values()]

    def _state(self, name: str) -> JobState:
        state = self._jobs.get(name)
        if state is None:
            raise UnknownJobError(f"scheduler {self.name!r} has no job {name!r}")
        return state


"""``schedulers`` and ``get_scheduler()``: schedulers built lazily from ``settings.ANARCHON``.

Like ``django.core.cache.caches``, but one scheduler per alias per *process*: a
scheduler owns a timer and running jobs, so it must not be rebuilt per thread (which
is why this is not a ``BaseConnectionHandler``).
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.utils.module_loading import import_string

from . import conf
from .exceptions import ConfigurationError, UnknownSchedulerError
from .redact import redact_text
from .registry import registry

if TYPE_CHECKING:
    from .engine import Scheduler


def build_backend(alias: str, config: dict[str, Any]) -> Any:
    """Import ``BACKEND`` and call it with ``OPTIONS``; errors name the scheduler and setting."""
    path = config["BACKEND"]
    if not isinstance(path, str):
        raise ConfigurationError(
            "BACKEND must be a dotted path to a backend class",
            option=f"ANARCHON[{alias!r}]['BACKEND']", value=path,
        )
    try:
        backend_class = import_string(path)
    except ImportError as exc:
        raise ConfigurationError(
            f"cannot import the backend ({exc})", option=f"ANARCHON[{alias!r}]['BACKEND']", value=path
        ) from exc
    options = config["OPTIONS"]
    if not isinstance(options, dict):
        raise _options_error(
            alias, f"expected a dict of the backend's keyword arguments, not a {type(options).__name__}"
        )
    return construct_backend(alias, backend_class, options)


def construct_backend(alias: str, backend_class: Any, options: dict[str, Any]) -> Any:
    """``backend_class(**options)``; a wrong key is named with the keys the backend accepts.

    The error names keys, never values: ``OPTIONS`` holds URLs and passwords, and this
    text reaches logs, consoles and ``manage.py check``.
    """
    unknown, accepted = _unknown_keys(backend_class, options)
    if unknown:
        raise _options_error(
            alias, f"unknown key(s) {', '.join(map(repr, unknown))} for the backend "
            f"{_class_path(backend_class)}; it accepts {', '.join(accepted) or 'none'}"
        )
    try:
        return backend_class(**options)
    except TypeError as exc:
        raise _options_error(
            alias, f"the backend {_class_path(backend_class)} refused the keys "
            f"{', '.join(map(repr, options)) or '(none)'}: {redact_text(exc)}"
        ) from exc


def _options_error(alias: str, message: str) -> ConfigurationError:
    """An error about ``OPTIONS`` that names the setting but not its value (it holds secrets)."""
    option = f"ANARCHON[{alias!r}]['OPTIONS']"
    error = ConfigurationError(f"settings.{option}: {message}")
    error.option = option
    return error


def _class_path(cls: Any) -> str:
    return f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', cls)}"


def _unknown_keys(backend_class: Any, options: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The keys of ``options`` the constructor has no parameter for, and those it has."""
    try:
        parameters = inspect.signature(backend_class).parameters.values()
    except (TypeError, ValueError):  # no signature to read: let the call decide
        return [], []
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return [], []
    accepted = sorted(
        p.name for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
    )
    return sorted(str(key) for key in options if key not in accepted), accepted


def build_scheduler(alias: str = conf.DEFAULT_ALIAS, **overrides: Any) -> Scheduler:
    """A new scheduler for ``alias`` with its jobs registered; ``overrides`` replace settings keys.

    ``schedulers[alias]`` caches one per process; the worker command builds its own with
    an ``INSTANCE_ID`` override.
    """
    from .engine import Scheduler

    config = conf.get_config()
    if alias not in config:
        raise UnknownSchedulerError(
            f"no scheduler {alias!r} in settings.ANARCHON (configured: {', '.join(config)})"
        )
    entry = {**config[alias], **{k.upper(): v for k, v in overrides.items()}}
    job_defaults = entry["JOB_DEFAULTS"]
    if not isinstance(job_defaults, dict):
        raise ConfigurationError(
            "JOB_DEFAULTS must be a dict of job options",
            option=f"ANARCHON[{alias!r}]['JOB_DEFAULTS']", value=job_defaults,
        )
    scheduler = Scheduler(
        build_backend(alias, entry),
        name=alias,
        instance_id=entry["INSTANCE_ID"],
        lease=entry["LEASE"],
        heartbeat=entry["HEARTBEAT"],
        job_defaults=job_defaults,
        data=entry["DATA"],
        threads=entry["THREADS"],
        default_timezone=getattr(settings, "TIME_ZONE", None) or "UTC",
        spool=conf.spool_directory(entry["SPOOL"], option=f"ANARCHON[{alias!r}]['SPOOL']"),
    )
    registry.install(scheduler, alias)
    return scheduler


class SchedulerHandler:
    """Schedulers by alias, each built on first access and kept for the process."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._schedulers: dict[str, Scheduler] = {}

    def __getitem__(self, alias: str) -> Scheduler:
        with self._lock:
            if alias not in self._schedulers:
                self._schedulers[alias] = build_scheduler(alias)
            return self._schedulers[alias]

    def __contains__(self, alias: object) -> bool:
        return alias in conf.get_config()

    def __iter__(self) -> Iterator[str]:
        return iter(conf.get_config())

    def __len__(self) -> int:
        return len(conf.get_config())

    def all(self) -> list[Scheduler]:
        return [self[alias] for alias in self]

    def built(self) -> list[Scheduler]:
        """The schedulers built so far, without building more."""
        with self._lock:
            return list(self._schedulers.values())

    def reset(self, **kwargs: Any) -> None:
        """``setting_changed`` receiver: forget schedulers that are not running."""
        if kwargs.get("setting") not in (None, "ANARCHON", "TIME_ZONE"):
            return
        with self._lock:
            for alias, scheduler in list(self._schedulers.items()):
                if not scheduler.running:
                    del self._schedulers[alias]


schedulers = SchedulerHandler()


def get_scheduler(alias: str = conf.DEFAULT_ALIAS) -> Scheduler:
    """The process's scheduler for ``alias`` (default ``"default"``), built from settings."""
    return schedulers[alias]

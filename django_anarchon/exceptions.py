"""Errors raised by django-anarchon.

Every configuration error names the job (or scheduler), the option and the bad value,
so the message alone tells the user what to fix.
"""

from __future__ import annotations

from typing import Any


class AnarchonError(Exception):
    """Base class of every error this app raises on purpose."""


class ConfigurationError(AnarchonError, ValueError):
    """A job, scheduler or backend option has a wrong type or value."""

    def __init__(
        self, message: str, *, job: str | None = None, option: str | None = None, value: Any = None
    ) -> None:
        self.job = job
        self.option = option
        self.value = value
        #: The message without the "job ..., option ... = value" prefix, for callers that
        #: name the place themselves (a scheduler's setting, a command-line flag).
        self.reason = message
        parts = []
        if job is not None:
            parts.append(f"job {job!r}")
        if option is not None:
            parts.append(f"option {option!r}")
        prefix = ", ".join(parts)
        if option is not None:
            prefix += f" = {value!r}"
        super().__init__(f"{prefix}: {message}" if prefix else message)


class DuplicateJobError(ConfigurationError):
    """Two registrations use the same job name on one scheduler."""


class UnknownJobError(AnarchonError, KeyError):
    """A job name that no scheduler knows."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown job"


class UnknownSchedulerError(AnarchonError, KeyError):
    """A scheduler alias missing from settings.ANARCHON."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown scheduler"


class JobTimeoutError(AnarchonError, TimeoutError):
    """A handler ran longer than its job's ``timeout``."""


class AbortedError(AnarchonError):
    """Raised by ``signal.raise_if_aborted()`` once the run's signal is aborted."""

    def __init__(self, reason: str | None) -> None:
        self.reason = reason
        super().__init__(f"run aborted ({reason})" if reason else "run aborted")

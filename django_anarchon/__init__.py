"""django-anarchon: scheduled jobs that run exactly once across every instance of a project.

Public names only (SPEC section 2). Nothing here imports models, so the package can be
imported before Django's app registry is ready.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .backends.base import (
    ActiveRun,
    Backend,
    BaseBackend,
    ClaimInput,
    ClaimOutcome,
    ClaimRecord,
    JobInfo,
    JobLimits,
    LedgerStore,
    PauseState,
    RunClaim,
    RunRecord,
    RunStore,
    SlotMark,
    StoredResult,
    Wakeup,
    build_history,
)
from .exceptions import (
    AbortedError,
    AnarchonError,
    ConfigurationError,
    DuplicateJobError,
    JobTimeoutError,
    UnknownJobError,
    UnknownSchedulerError,
)
from .registry import at, cron, every, scheduled

if TYPE_CHECKING:
    from .engine import AbortSignal, BackfillPlan, JobContext, LedgerEntry, Scheduler
    from .handler import get_scheduler, schedulers

# The engine and the settings handler load on first use: importing the package stays cheap.
_LAZY = {
    "Scheduler": "django_anarchon.engine",
    "JobContext": "django_anarchon.engine",
    "AbortSignal": "django_anarchon.engine",
    "BackfillPlan": "django_anarchon.engine",
    "LedgerEntry": "django_anarchon.engine",
    "schedulers": "django_anarchon.handler",
    "get_scheduler": "django_anarchon.handler",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'django_anarchon' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "AbortSignal",
    "AbortedError",
    "ActiveRun",
    "AnarchonError",
    "Backend",
    "BackfillPlan",
    "BaseBackend",
    "ClaimInput",
    "ClaimOutcome",
    "ClaimRecord",
    "ConfigurationError",
    "DuplicateJobError",
    "JobContext",
    "JobInfo",
    "JobLimits",
    "JobTimeoutError",
    "LedgerEntry",
    "LedgerStore",
    "PauseState",
    "RunClaim",
    "RunRecord",
    "RunStore",
    "Scheduler",
    "SlotMark",
    "StoredResult",
    "UnknownJobError",
    "UnknownSchedulerError",
    "Wakeup",
    "at",
    "build_history",
    "cron",
    "every",
    "get_scheduler",
    "scheduled",
    "schedulers",
]

"""Checks for django-health-check (extra ``[health-check]``): the stores, and overdue jobs.

``Store`` asks each scheduler's store a cheap read. ``Jobs`` is a dead-man's switch: a
periodic job whose last successful slot is more than ``missed_slots`` slots behind (the
setting ``ANARCHON_HEALTH_MISSED_SLOTS``, default 3) makes the check fail. A job with no
success in its history is judged from the first time this process checked it, so a fresh
deploy is not reported at once. One-off jobs are not judged. "Now" is the store's clock
where the store tells it (``runs.now_ms``), else this process's.

Messages name the scheduler, the job and the error's class, never the error's text (it
may carry a URL with a password).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from django.conf import settings
from health_check.base import HealthCheck
from health_check.exceptions import ServiceUnavailable

from django_anarchon.exceptions import ConfigurationError
from django_anarchon.wallclock import now_ms

if TYPE_CHECKING:
    from django_anarchon.engine import Scheduler

__all__ = ["DEFAULT_MISSED_SLOTS", "Jobs", "Store", "missed_slots_setting"]

DEFAULT_MISSED_SLOTS = 3
#: How many attempts of a job are read to find its last success.
HISTORY_DEPTH = 50

#: (scheduler, job) -> when this process first judged it (ms), for jobs never successful.
_FIRST_SEEN: dict[tuple[str, str], int] = {}


def missed_slots_setting() -> int:
    value = getattr(settings, "ANARCHON_HEALTH_MISSED_SLOTS", DEFAULT_MISSED_SLOTS)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(
            "expected a whole number of at least 1", option="ANARCHON_HEALTH_MISSED_SLOTS",
            value=value,
        )
    return value


def _schedulers(alias: str | None) -> list[Scheduler]:
    from django_anarchon.handler import schedulers

    return [schedulers[alias]] if alias is not None else schedulers.all()


@dataclasses.dataclass
class Store(HealthCheck):  # type: ignore[misc]
    """The store of each scheduler (or of ``alias``) answers a cheap read."""

    alias: str | None = None

    async def run(self) -> None:
        for scheduler in _schedulers(self.alias):
            try:
                jobs = scheduler.jobs()
                if jobs:
                    await scheduler.ahistory(jobs[0].name, 1)
                else:
                    await scheduler.backend.init()
            except Exception as exc:
                raise ServiceUnavailable(
                    f"the store of scheduler {scheduler.name!r} failed: {type(exc).__name__}"
                ) from exc


@dataclasses.dataclass
class Jobs(HealthCheck):  # type: ignore[misc]
    """No periodic job is more than ``missed_slots`` slots behind its last success."""

    alias: str | None = None
    missed_slots: int | None = None

    async def run(self) -> None:
        missed = self.missed_slots if self.missed_slots is not None else missed_slots_setting()
        overdue: list[str] = []
        for scheduler in _schedulers(self.alias):
            for info in scheduler.jobs():
                if info.type == "once":
                    continue
                try:
                    behind = await _slots_behind(scheduler, info.name, missed + 1)
                except Exception as exc:
                    raise ServiceUnavailable(
                        f"the store of scheduler {scheduler.name!r} failed: {type(exc).__name__}"
                    ) from exc
                if behind:
                    overdue.append(f"{scheduler.name}:{info.name}")
        if overdue:
            raise ServiceUnavailable(
                f"no success in the last {missed} slots: {', '.join(overdue)}"
            )


async def _slots_behind(scheduler: Scheduler, job: str, count: int) -> bool:
    """Whether ``count`` slots came due since the job's last success (or first check)."""
    schedule = scheduler.get_job(job).schedule
    clock = getattr(scheduler.backend.runs, "now_ms", None)
    now = await clock(job) if callable(clock) else now_ms()
    since: int | None = None
    for record in await scheduler.ahistory(job, HISTORY_DEPTH):
        if record.status == "success":
            since = record.slot
            break
    if since is None:
        since = _FIRST_SEEN.setdefault((scheduler.name, job), now)
    cursor: int | None = now
    for _ in range(count):
        assert cursor is not None
        cursor = schedule.latest_at_or_before(cursor)
        if cursor is None or cursor <= since:
            return False
        cursor -= 1
    return True

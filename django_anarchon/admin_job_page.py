"""What the per-job page reads: the job's history, ledger and pause, and its backfills.

The three store reads run in parallel in the admin's read pool (admin_jobs.py) within one
deadline, each with its own error, so a failing ledger read leaves the history standing.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from . import admin_jobs
from .admin_format import attempt_and_reason, error_summary, format_ms, format_when, status_badge
from .admin_jobs import history_cache, history_query, pause_text, read_failure, scheduler_of
from .admin_timeline import LEDGER_LIMIT, SPANS, Timeline, build_timeline
from .backends.base import PauseState, RunRecord, ledger_of, ms_to_datetime
from .enqueue.links import TaskLink, task_links
from .exceptions import UnknownJobError
from .schedules import Fire, preview

if TYPE_CHECKING:
    from .engine.ledger import LedgerEntry
    from .jobs import Job
    from .models import BackfillRequest

__all__ = ["BackfillRow", "HistoryRow", "JobPage", "backfill_rows", "read_job_page"]

#: How many coming fire times a job's page lists.
UPCOMING = 10
#: How many attempts the per-job page lists, and how many backfill requests.
HISTORY_LENGTH = 100
BACKFILLS_LISTED = 10


@dataclass
class HistoryRow:
    """One attempt as the per-job history page shows it."""

    record: RunRecord
    #: The task the run enqueued (a job with a target), where it is recorded.
    task: TaskLink | None = None

    def badge(self) -> SafeString:
        return status_badge(self.record.status)

    def duration(self) -> str:
        return format_ms(self.record.duration_ms)

    def attempt(self) -> str:
        return attempt_and_reason(self.record)

    def scheduled(self) -> str:
        return format_when(self.record.scheduled_at)

    def started(self) -> str:
        return format_when(self.record.started_at)

    def started_late_by(self) -> str:
        """The start as "+40ms" after the scheduled time: one column narrower than a timestamp."""
        late = round((self.record.started_at - self.record.scheduled_at).total_seconds() * 1000)
        return ("+" if late >= 0 else "-") + format_ms(abs(late))

    def error_summary(self) -> str:
        return error_summary(self.record.error)


@dataclass
class JobPage:
    """What the per-job page shows, each part with its own error when its read failed."""

    alias: str
    name: str
    job: Job | None = None
    rows: list[HistoryRow] = field(default_factory=list)
    error: str | None = None
    has_ledger: bool = False
    timeline: Timeline | None = None
    ledger_error: str | None = None
    pause: PauseState | None = None
    pause_error: str | None = None
    target: str = ""
    schedule: str = ""
    policies: str = ""
    upcoming: list[Fire] = field(default_factory=list)

    @property
    def pause_text(self) -> str:
        return pause_text(self.pause) if self.pause is not None else ""


def read_job_page(alias: str, name: str, span: str, link_backfills: bool) -> JobPage:
    """The job's history, ledger and pause, read in parallel within one deadline."""
    scheduler = scheduler_of(alias)
    page = JobPage(alias, name)
    try:
        page.job = scheduler.get_job(name)
    except UnknownJobError:
        page.job = None
    history = history_cache.submit(scheduler.history, name, HISTORY_LENGTH)
    ledger: Future[list[LedgerEntry]] | None = None
    pauses: Future[dict[str, PauseState]] | None = None
    now = scheduler.clock.now()
    span_ms = SPANS[span]
    if page.job is not None:
        page.has_ledger = ledger_of(scheduler.backend) is not None
        since = ms_to_datetime(now - span_ms)
        ledger = history_cache.submit(scheduler.ledger, name, since, None, LEDGER_LIMIT)
        if page.has_ledger:
            pauses = history_cache.submit(scheduler.pauses, [name])
    futures: list[Future[Any]] = [f for f in (history, ledger, pauses) if f is not None]
    wait_futures(futures, timeout=admin_jobs.READ_TIMEOUT_S * 2)
    page.error = read_failure(history)
    records = history.result() if page.error is None else []
    if ledger is not None:
        page.ledger_error = read_failure(ledger)
        if page.ledger_error is None:
            entries = ledger.result()
            end = max([now, *(e.last_slot for e in entries)])
            query = f"{history_query(alias, name)}&{urlencode({'span': span})}"
            page.timeline = build_timeline(
                page.job, entries, end, span_ms, LEDGER_LIMIT,
                backfill_query=query if link_backfills else None,
            )
    if pauses is not None:
        page.pause_error = read_failure(pauses)
        if page.pause_error is None:
            page.pause = pauses.result().get(name)
    links: dict[int, TaskLink] = {}
    if page.job is not None:
        page.target = page.job.target.describe() if page.job.target is not None else ""
        links = task_links(page.job, scheduler.backend, [r.slot for r in records])
        page.schedule, page.policies, page.upcoming = _upcoming(page.job)
    page.rows = [HistoryRow(r, links.get(r.slot)) for r in records]
    return page


def _upcoming(job: Job) -> tuple[str, str, list[Fire]]:
    """A job's schedule, its policies and its next fire times, marked where DST moves them
    (pure, no store)."""
    from django.utils import timezone

    now = int(time.time() * 1000)
    schedule = job.schedule
    upcoming = preview(schedule, now, UPCOMING, timezone.get_current_timezone_name())
    return schedule.describe(), job.policies(), upcoming


@dataclass
class BackfillRow:
    """A filed backfill as the per-job page lists it."""

    request: BackfillRequest

    @property
    def total(self) -> int:
        return len(self.request.slots)

    @property
    def percent(self) -> int:
        return round(self.request.done * 100 / self.total) if self.total else 100

    @property
    def range(self) -> str:
        return _("%(first)s to %(last)s") % {
            "first": format_when(ms_to_datetime(self.request.start_ms)),
            "last": format_when(ms_to_datetime(self.request.end_ms)),
        }

    @property
    def state(self) -> str:
        r = self.request
        if r.finished_at is not None:
            return _("finished %(when)s") % {"when": format_when(r.finished_at)}
        if r.claimed_at is not None:  # its worker may have died since: say when it last noted
            return _("running on %(instance)s (last noted %(when)s)") % {
                "instance": r.claimed_by, "when": format_when(r.claimed_at)}
        return _("waiting for a worker")

    @property
    def requested(self) -> str:
        return format_when(self.request.requested_at)


def backfill_rows(alias: str, job: str) -> list[BackfillRow]:
    from .models import BackfillRequest

    requests = BackfillRequest.objects.filter(scheduler=alias, job=job)
    return [BackfillRow(r) for r in requests.order_by("-requested_at")[:BACKFILLS_LISTED]]

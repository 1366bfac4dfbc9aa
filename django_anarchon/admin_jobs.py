"""What the Jobs page reads, through each scheduler's public API, and the read pool.

So it works with any backend. Reads run in a small thread pool with a deadline and a
short cache (the per-job page, admin_job_page.py, uses the pool too): a slow or failing
store makes a page say so instead of hanging it. Per scheduler the Jobs page reads each
job's recent history (the store API reads one job at a time) and the pauses in force with
one ``pauses()`` call for all its jobs; the tasks of the last runs of jobs with a target
come in one query per database.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlencode

from django.db import connections
from django.utils.html import format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from . import conf
from .admin_format import error_summary, format_ago, format_when
from .backends.base import JobInfo, PauseState, RunRecord, ledger_of, ms_to_datetime
from .enqueue.links import TaskLink, task_links_of_many
from .exceptions import UnknownJobError
from .redact import describe_backend, redact_text

if TYPE_CHECKING:
    from .engine import Scheduler
    from .jobs import Job
    from .models import RunRequest

T = TypeVar("T")

#: How many runs the status strip shows per job.
STRIP_LENGTH = 20
#: How long the Jobs page waits for all stores together before showing what it has.
READ_TIMEOUT_S = 2.0
#: How long a read is reused between page loads.
CACHE_TTL_S = 5.0


def scheduler_of(alias: str) -> Scheduler:
    from .handler import schedulers

    return schedulers[alias]


def history_query(alias: str, job: str) -> str:
    """The per-job page's query string.

    The job name travels as a query parameter, never in the path: a path segment ``.``,
    ``..`` (or ``%2e%2e``) is normalised away by browsers and proxies, so jobs named
    ``..`` or ``a/../b`` would link to another job's page.
    """
    return urlencode({"scheduler": alias, "job": job})


def pause_text(state: PauseState) -> str:
    """ "by alice, 3 minutes ago, until 2026-05-01 14:00:00 UTC": who, since when, until."""
    parts = []
    if state.by:
        parts.append(_("by %(who)s") % {"who": state.by})
    parts.append(format_ago(ms_to_datetime(state.at)))
    if state.until is not None:
        parts.append(_("until %(when)s") % {"when": format_when(ms_to_datetime(state.until))})
    else:
        parts.append(_("until resumed"))
    return ", ".join(parts)


def pause_title(state: PauseState) -> str:
    text = _("paused at %(when)s") % {"when": format_when(ms_to_datetime(state.at))}
    return f"{text}, {pause_text(state)}" + (f": {state.note}" if state.note else "")


@dataclass
class JobRow:
    scheduler: str
    info: JobInfo
    job: Job | None = None
    runs: list[RunRecord] | None = None  # newest first; None: the store did not answer in time
    error: str | None = None
    #: The task the job enqueues instead of running a handler (``TaskTarget.describe()``).
    target: str = ""
    #: The task the last run enqueued, where it is recorded.
    last_task: TaskLink | None = None
    #: The pause in force, if any.
    pause: PauseState | None = None

    @property
    def last_run(self) -> RunRecord | None:
        return self.runs[0] if self.runs else None

    @property
    def strip(self) -> list[RunRecord]:
        """Oldest first, so the strip reads left to right like a timeline."""
        return list(reversed(self.runs or []))

    @property
    def strip_html(self) -> SafeString:
        return strip_html(self)

    @property
    def last_run_ago(self) -> str:
        last = self.last_run
        return format_ago(last.started_at) if last is not None else ""

    @property
    def history_query(self) -> str:
        return history_query(self.scheduler, self.info.name)

    @property
    def pause_text(self) -> str:
        return pause_text(self.pause) if self.pause is not None else ""

    @property
    def pause_title(self) -> str:
        return pause_title(self.pause) if self.pause is not None else ""


@dataclass
class SchedulerSection:
    alias: str
    backend: str = ""
    rows: list[JobRow] = field(default_factory=list)
    error: str | None = None
    #: The store keeps a ledger: its jobs can be paused and backfilled.
    has_ledger: bool = False
    #: Why the pauses are unknown (the store did not answer, or failed).
    pause_error: str | None = None


def _closing(fn: Callable[..., T], *args: Any) -> T:
    try:
        return fn(*args)
    finally:
        connections.close_all()  # this pool thread's own connections only


class ReadCache:
    """Recent reads, shared by page loads; a read in flight is joined, not repeated."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        # (alias, scheduler id, what, job): a rebuilt scheduler (new settings) never
        # reuses old reads
        self._entries: dict[tuple[str, int, str, str], tuple[float, Future[Any]]] = {}

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="anarchon-admin")
        return self._pool

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """An uncached read in the pool (the per-job page reads afresh each time)."""
        return self._executor().submit(_closing, fn, *args)

    def cached(self, key: tuple[str, int, str, str], fn: Callable[..., T], *args: Any
               ) -> Future[T]:
        now = time.monotonic()
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                started, future = entry
                if not future.done() or now - started < CACHE_TTL_S:
                    return future
            future = self.submit(fn, *args)
            self._entries[key] = (now, future)
            return future

    def get(self, alias: str, scheduler: Scheduler, job: str) -> Future[list[RunRecord]]:
        """The job's recent history (the strip's length)."""
        return self.cached((alias, id(scheduler), "history", job), scheduler.history, job,
                           STRIP_LENGTH)

    def pauses(self, alias: str, scheduler: Scheduler) -> Future[dict[str, PauseState]]:
        """The pauses in force among all the scheduler's jobs: one store call."""
        return self.cached((alias, id(scheduler), "pauses", ""), scheduler.pauses)

    def forget(self, alias: str | None = None, job: str | None = None) -> None:
        """Drop the reads of ``job`` of ``alias`` (and the scheduler's pauses) or all."""
        with self._lock:
            for key in list(self._entries):
                if alias is not None and key[0] != alias:
                    continue
                if job is None or key[3] == job or key[2] == "pauses":
                    del self._entries[key]


history_cache = ReadCache()


def read_failure(future: Future[Any]) -> str | None:
    """Why a read has no result: not done within the deadline, or its error (redacted)."""
    if not future.done():
        return _("the store did not answer in time")
    failure = future.exception()
    if failure is not None:
        return f"{type(failure).__name__}: {redact_text(failure)}"
    return None


def collect_sections(timeout: float | None = None) -> list[SchedulerSection]:
    """Every job of every configured scheduler with its recent runs and pause, within
    ``timeout``."""
    timeout = READ_TIMEOUT_S if timeout is None else timeout
    sections: list[SchedulerSection] = []
    pending: list[tuple[JobRow, Future[list[RunRecord]]]] = []
    pause_reads: list[tuple[SchedulerSection, Future[dict[str, PauseState]]]] = []
    for alias in conf.get_config():
        section = SchedulerSection(alias)
        sections.append(section)
        try:
            scheduler = scheduler_of(alias)
            section.backend = describe_backend(scheduler.backend)
            infos = sorted(scheduler.jobs(), key=lambda info: info.name)
        except Exception as exc:  # a broken scheduler must not hide the others
            section.error = f"{type(exc).__name__}: {redact_text(exc)}"
            continue
        section.has_ledger = ledger_of(scheduler.backend) is not None
        for info in infos:
            row = JobRow(alias, info)
            with contextlib.suppress(UnknownJobError):  # unregistered since jobs()
                row.job = scheduler.get_job(info.name)
            if row.job is not None and row.job.target is not None:
                row.target = row.job.target.describe()
            section.rows.append(row)
            pending.append((row, history_cache.get(alias, scheduler, info.name)))
        if section.has_ledger and infos:
            pause_reads.append((section, history_cache.pauses(alias, scheduler)))
    futures: list[Future[Any]] = [f for _, f in pending] + [f for _, f in pause_reads]
    if futures:
        wait_futures(futures, timeout=timeout)
    for row, future in pending:
        row.error = read_failure(future)
        if row.error is None:
            row.runs = future.result()
    for section, pauses in pause_reads:
        section.pause_error = read_failure(pauses)
        if section.pause_error is None:
            found = pauses.result()
            for row in section.rows:
                row.pause = found.get(row.info.name)
    for section in sections:
        _last_tasks(section)
    return sections


def _last_tasks(section: SchedulerSection) -> None:
    """The tasks the last runs enqueued, for every job of the section with a target."""
    wanted = [
        (row, row.job, row.last_run.slot)
        for row in section.rows
        if row.target and row.job is not None and row.last_run is not None
    ]
    if not wanted:
        return
    links = task_links_of_many(
        scheduler_of(section.alias).backend, [(job, slot) for _, job, slot in wanted]
    )
    for row, job, slot in wanted:
        row.last_task = links.get((job.name, slot))


def strip_html(row: JobRow) -> SafeString:
    cells = []
    for record in row.strip:
        title = f"{record.status} · {format_when(record.scheduled_at)} · {record.instance_id}"
        if record.manual:
            title += " · manual"
        if record.error:
            title += f" · {error_summary(record.error, 200)}"
        cells.append((record.status, title))
    return format_html_join("", '<span class="anarchon-cell anarchon-{}" title="{}"></span>', cells)


def pending_requests() -> list[RunRequest]:
    from .models import RunRequest

    return list(RunRequest.objects.filter(claimed_at__isnull=True).order_by("-requested_at")[:20])

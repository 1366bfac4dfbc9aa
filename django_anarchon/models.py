"""The database backend's tables: job locks, run leases, attempt history, run-now requests.

Lease times (``*_ms`` columns) are integer epoch milliseconds read from the database
server's clock, so every instance compares them against the same "now" and integer
arithmetic in SQL is the same on every database. History times are ``DateTimeField``s
so that the admin can filter and browse them by date.
"""

from __future__ import annotations

from datetime import UTC, datetime

from django.db import models
from django.utils.translation import gettext_lazy as _

from .backends.base import ms_to_datetime

__all__ = [
    "BackfillRequest", "BufferedSlot", "EnqueuedTask", "JobLock", "LedgerMark", "Run",
    "RunAttempt", "RunRequest", "ScheduledJob",
]


class RunState(models.TextChoices):
    RUNNING = "running", _("running")
    FINISHED = "finished", _("finished")
    #: Won through ``claim()`` (claim-only use of the backend): never leased, never forgotten.
    CLAIMED = "claimed", _("claimed")


class RunStatus(models.TextChoices):
    RUNNING = "running", _("running")
    SUCCESS = "success", _("success")
    FAILED = "failed", _("failed")
    INTERRUPTED = "interrupted", _("interrupted")


class RunLeaseStatus(models.TextChoices):
    """A run lease's last status: an attempt's, or ``cancelled`` (overlap "cancel_other")."""

    RUNNING = "running", _("running")
    SUCCESS = "success", _("success")
    FAILED = "failed", _("failed")
    INTERRUPTED = "interrupted", _("interrupted")
    #: A later slot's claim fenced it: never retried, its old token refused everywhere.
    CANCELLED = "cancelled", _("cancelled")


class RunReason(models.TextChoices):
    SCHEDULED = "scheduled", _("scheduled")
    MANUAL = "manual", _("manual")
    CATCH_UP = "catch-up", _("catch-up")
    TAKEOVER = "takeover", _("takeover")
    BACKFILL = "backfill", _("backfill")


class JobLock(models.Model):
    """One row per job: claims that must see the job's other runs lock it in turn.

    It also holds what the store knows of the job itself: its pause (``paused_at_ms`` set)
    and since when it has had its current schedule. Every such column is nullable, so that
    the previous release, which inserts rows without them, keeps working during a deploy.
    """

    job = models.CharField(_("job"), max_length=255, unique=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)
    paused_at_ms = models.BigIntegerField(
        _("paused at"), null=True, blank=True,
        help_text=_("Epoch milliseconds on the database server's clock; empty: not paused."),
    )
    paused_until_ms = models.BigIntegerField(
        _("paused until"), null=True, blank=True,
        help_text=_("The pause ends by itself then (empty: until resumed)."),
    )
    paused_by = models.CharField(_("paused by"), max_length=150, null=True, blank=True)
    pause_note = models.TextField(_("pause note"), null=True, blank=True)
    schedule_fingerprint = models.CharField(
        _("schedule fingerprint"), max_length=64, null=True, blank=True
    )
    known_since_ms = models.BigIntegerField(
        _("known since"), null=True, blank=True,
        help_text=_("Since when the store has known the job with this schedule."),
    )

    class Meta:
        verbose_name = _("job lock")
        verbose_name_plural = _("job locks")

    def __str__(self) -> str:
        return self.job


class Run(models.Model):
    """One run (job, slot) and the lease of its current attempt: the lease rules' state."""

    job = models.CharField(_("job"), max_length=255)
    slot = models.BigIntegerField(_("slot"), help_text=_("Scheduled instant, epoch milliseconds."))
    attempt = models.PositiveIntegerField(_("attempt"), default=1)
    token = models.CharField(_("token"), max_length=255)
    instance_id = models.CharField(_("owner instance"), max_length=255)
    lease_until_ms = models.BigIntegerField(
        _("lease until"), help_text=_("Epoch milliseconds on the database server's clock.")
    )
    state = models.CharField(_("state"), max_length=16, choices=RunState.choices)
    status = models.CharField(
        _("last attempt status"), max_length=16, choices=RunLeaseStatus.choices, null=True,
        blank=True,
    )
    reason = models.CharField(_("reason"), max_length=16, choices=RunReason.choices)
    manual = models.BooleanField(_("manual"), default=False)
    started_at_ms = models.BigIntegerField(
        _("attempt started at"), help_text=_("Epoch milliseconds on the database server's clock.")
    )
    finished_at_ms = models.BigIntegerField(_("finished at"), null=True, blank=True)
    keep_ms = models.BigIntegerField(
        _("kept for"),
        null=True,
        blank=True,
        help_text=_("How long the run is remembered once finished, in milliseconds."),
    )
    #: Null on rows the previous release wrote: such a run is never swept (its limit is unknown).
    max_attempts = models.PositiveIntegerField(
        _("max attempts"),
        null=True,
        blank=True,
        help_text=_("The largest max_attempts any claim of the run carried."),
    )

    class Meta:
        verbose_name = _("run lease")
        verbose_name_plural = _("run leases")
        constraints = [
            models.UniqueConstraint(fields=["job", "slot"], name="anarchon_run_job_slot"),
        ]
        # No other index: the unique (job, slot) serves every query by job (overlap checks,
        # active()), and a job keeps few rows here (finished runs are forgotten after
        # keep_ms). A second index on (job, ...) made contested claims a third slower on
        # PostgreSQL (docs/backends/database.md).

    def __str__(self) -> str:
        return f"{self.job} @ {_utc(self.scheduled_at)} #{self.attempt}"

    @property
    def scheduled_at(self) -> datetime:
        return ms_to_datetime(self.slot)

    @property
    def lease_until(self) -> datetime:
        return ms_to_datetime(self.lease_until_ms)


class BufferedSlot(models.Model):
    """A slot that waits for its job's running slot (overlap "buffer_one"/"buffer_all").

    Kept in the store so that every instance sees the same buffer; ``hold_until_ms`` is
    pushed on by each waiting instance's claim, and a slot whose waiters all went away is
    dropped once it passes.
    """

    job = models.CharField(_("job"), max_length=255)
    slot = models.BigIntegerField(_("slot"), help_text=_("Scheduled instant, epoch milliseconds."))
    hold_until_ms = models.BigIntegerField(
        _("held until"), help_text=_("Epoch milliseconds on the database server's clock.")
    )

    class Meta:
        verbose_name = _("buffered slot")
        verbose_name_plural = _("buffered slots")
        constraints = [
            models.UniqueConstraint(fields=["job", "slot"], name="anarchon_buffered_job_slot"),
        ]

    def __str__(self) -> str:
        return f"{self.job} @ {_utc(ms_to_datetime(self.slot))}"


class LedgerFate(models.TextChoices):
    SKIPPED = "skipped", _("skipped")
    MISSED = "missed", _("missed")


class LedgerMark(models.Model):
    """A slot's fate that history does not show: a skip a claim decided, or missed slots.

    ``slot``..``last_slot`` is a range of ``count`` slots of the schedule (missed slots);
    a skip is one slot. Marks of one job never overlap (``LedgerStore`` in backends/base).
    """

    job = models.CharField(_("job"), max_length=255)
    slot = models.BigIntegerField(_("slot"), help_text=_("Scheduled instant, epoch milliseconds."))
    last_slot = models.BigIntegerField(_("last slot"))
    count = models.PositiveIntegerField(_("slots"), default=1)
    fate = models.CharField(_("fate"), max_length=16, choices=LedgerFate.choices)
    reason = models.CharField(_("reason"), max_length=16)
    at_ms = models.BigIntegerField(
        _("recorded at"), help_text=_("Epoch milliseconds on the database server's clock.")
    )
    instance_id = models.CharField(_("instance"), max_length=255)

    class Meta:
        verbose_name = _("ledger mark")
        verbose_name_plural = _("ledger marks")
        constraints = [
            models.UniqueConstraint(fields=["job", "slot"], name="anarchon_mark_job_slot"),
        ]

    def __str__(self) -> str:
        return f"{self.job} @ {_utc(ms_to_datetime(self.slot))}: {self.fate} ({self.reason})"


class BackfillRequest(models.Model):
    """A backfill asked for by a command or the admin; workers of ``scheduler`` run it.

    ``slots`` are the slots it runs, oldest first (computed when it was filed); each goes
    through the normal claim with reason ``backfill``, so two requests for one range run
    each slot once. A worker notes its progress, and renews ``claimed_at`` while a slot
    runs: a note older than ``run_requests.ABANDONED_AFTER_S`` means its worker died (or
    lost the database), and another worker goes on with it.
    """

    scheduler = models.CharField(_("scheduler"), max_length=100, default="default")
    job = models.CharField(_("job"), max_length=255)
    start_ms = models.BigIntegerField(_("from"))
    end_ms = models.BigIntegerField(_("to"))
    slots = models.JSONField(_("slots"), default=list)
    overlap = models.CharField(_("overlap"), max_length=16, default="skip")
    requested_by = models.CharField(_("requested by"), max_length=150, blank=True)
    requested_at = models.DateTimeField(_("requested at"), auto_now_add=True)
    claimed_by = models.CharField(_("claimed by instance"), max_length=255, blank=True)
    claimed_at = models.DateTimeField(_("claimed at"), null=True, blank=True)
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    done = models.PositiveIntegerField(_("slots done"), default=0)

    class Meta:
        verbose_name = _("backfill request")
        verbose_name_plural = _("backfill requests")
        ordering = ["-requested_at"]
        indexes = [
            models.Index(fields=["scheduler", "finished_at"], name="anarchon_backfill_open"),
        ]

    def __str__(self) -> str:
        return f"{self.job} ({self.scheduler}): {len(self.slots)} slot(s)"


class EnqueueState(models.TextChoices):
    #: The beat is about to enqueue (written first, committed, outside the one-transaction path).
    ENQUEUING = "enqueuing", _("enqueuing")
    ENQUEUED = "enqueued", _("enqueued")


class EnqueuedTask(models.Model):
    """The task a job with a task target enqueued for one slot (``enqueue/run.py``).

    Unique on (job, slot): the beat looks here before it enqueues. ``enqueuing`` with no
    ``task_id`` is the marker of an enqueue whose outcome nobody recorded (its runner died
    or the enqueue raised): a takeover then asks the task system, and never enqueues again.
    """

    job = models.CharField(_("job"), max_length=255)
    slot = models.BigIntegerField(_("slot"), help_text=_("Scheduled instant, epoch milliseconds."))
    state = models.CharField(_("state"), max_length=16, choices=EnqueueState.choices)
    #: ``TaskTarget.describe()``: the task system, the task and its backend.
    target = models.CharField(_("task"), max_length=500)
    task_id = models.CharField(_("task id"), max_length=255, blank=True, default="")
    attempt = models.PositiveIntegerField(_("attempt"))
    instance_id = models.CharField(_("instance"), max_length=255)
    enqueued_at = models.DateTimeField(_("enqueued at"), null=True, blank=True)
    error = models.TextField(_("error"), blank=True, default="")

    class Meta:
        verbose_name = _("enqueued task")
        verbose_name_plural = _("enqueued tasks")
        constraints = [
            models.UniqueConstraint(fields=["job", "slot"], name="anarchon_enqueued_job_slot"),
        ]

    def __str__(self) -> str:
        return f"{self.job} @ {_utc(ms_to_datetime(self.slot))}: {self.task_id or self.state}"


class RunAttempt(models.Model):
    """One attempt of one run, from any instance: what history shows."""

    job = models.CharField(_("job"), max_length=255)
    slot = models.BigIntegerField(_("slot"), help_text=_("Scheduled instant, epoch milliseconds."))
    scheduled_at = models.DateTimeField(_("scheduled at"))
    instance_id = models.CharField(_("instance"), max_length=255)
    manual = models.BooleanField(_("manual"), default=False)
    attempt = models.PositiveIntegerField(_("attempt"), default=1)
    reason = models.CharField(_("reason"), max_length=16, choices=RunReason.choices)
    status = models.CharField(_("status"), max_length=16, choices=RunStatus.choices)
    started_at = models.DateTimeField(_("started at"))
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    duration_ms = models.BigIntegerField(_("duration (ms)"), null=True, blank=True)
    error = models.TextField(_("error"), null=True, blank=True)

    class Meta:
        # "44 run attempts" in the admin's counts (a plural of "run history" read "44 run history")
        verbose_name = _("run attempt")
        verbose_name_plural = _("run attempts")
        ordering = ["-started_at", "-slot", "-attempt"]
        constraints = [
            models.UniqueConstraint(
                fields=["job", "slot", "instance_id", "attempt", "manual"],
                name="anarchon_attempt_key",
            ),
        ]
        indexes = [
            # history(), pruning by size and age, the admin's per-job list
            models.Index(fields=["job", "started_at"], name="anarchon_attempt_job_started"),
            # the admin's list across jobs, newest first, and its date hierarchy
            models.Index(fields=["started_at"], name="anarchon_attempt_started"),
        ]

    def __str__(self) -> str:
        return f"{self.job} @ {_utc(self.scheduled_at)} #{self.attempt} ({self.status})"


class RunRequest(models.Model):
    """A "run now" asked for outside a worker (the admin); a worker of ``scheduler`` runs it."""

    scheduler = models.CharField(_("scheduler"), max_length=100, default="default")
    job = models.CharField(_("job"), max_length=255)
    data = models.JSONField(_("data"), null=True, blank=True)
    requested_by = models.CharField(_("requested by"), max_length=150, blank=True)
    requested_at = models.DateTimeField(_("requested at"), auto_now_add=True)
    claimed_by = models.CharField(_("claimed by instance"), max_length=255, blank=True)
    claimed_at = models.DateTimeField(_("claimed at"), null=True, blank=True)
    slot = models.BigIntegerField(
        _("slot"), null=True, blank=True, help_text=_("The manual run's slot, once it started.")
    )

    class Meta:
        verbose_name = _("run request")
        verbose_name_plural = _("run requests")
        ordering = ["-requested_at"]
        indexes = [
            # workers look for the unclaimed requests of their scheduler
            models.Index(fields=["scheduler", "claimed_at"], name="anarchon_request_pending"),
        ]

    def __str__(self) -> str:
        return f"{self.job} ({self.scheduler})"


class ScheduledJob(RunRequest):
    """The admin's Jobs page (no table of its own) and the permission to run a job now.

    Jobs live in code and in the schedulers, not in a table; this proxy gives the page
    an admin entry and its permissions: ``view_scheduledjob`` to see the page,
    ``run_job`` to press "Run now".
    """

    class Meta:
        proxy = True
        verbose_name = _("job")
        verbose_name_plural = _("jobs")
        default_permissions = ("view",)
        permissions = [
            ("run_job", _("Can run a job now from the admin")),
            ("pause_job", _("Can pause and resume a job from the admin")),
            ("backfill_job", _("Can backfill a job from the admin")),
        ]


def _utc(instant: datetime) -> str:
    """A slot as the admin's titles show it: to the second, in UTC, and saying so."""
    return f"{instant.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"

"""The lease rules and history over the Django ORM: synchronous, one database alias.

Everything here runs in the backend's connection threads, never on an event loop. The
general claim path works on every supported database: one transaction that locks the
job's ``JobLock`` row (``select_for_update``; on SQLite a write to it, which takes the
database's write lock), reads the server's clock, and applies the rules of SPEC section 5
exactly as ``MemoryRunStore`` does, with the additions of SPEC section 9 (retention from
the later of slot and finish, ``keep_ms`` and ``max_attempts`` that only grow, ``early``,
the sweep, a repeat-safe ``finish``). On PostgreSQL the common cases take one round trip
through the functions the migrations install (``postgres.py``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, NamedTuple, TypeVar

from django.conf import settings
from django.db import (
    DatabaseError,
    IntegrityError,
    OperationalError,
    connections,
    models,
    transaction,
)
from django.db.models import BigIntegerField, Case, F, Field, Q, Value, When
from django.db.models.constants import OnConflict
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from ...models import BufferedSlot, JobLock, LedgerMark, Run, RunAttempt, RunState
from ..base import (
    BUFFER_POLICIES,
    CANCELLED,
    DEFAULT_KEEP_MS,
    MIN_KEEP_MS,
    PAUSABLE_REASONS,
    ActiveRun,
    ClaimInput,
    ClaimOutcome,
    FinalStatus,
    RunClaim,
    RunEnd,
    RunReason,
    RunRecord,
    StoredResult,
    buffer_answer,
    buffer_hold_ms,
    cancel_reason,
    forget_after_ms,
    ms_to_datetime,
)
from . import postgres
from .clock import ServerNowMs, now_ms_sql
from .ledger import PAUSE_COLUMNS, JobRow, Ledger

__all__ = ["Store"]

logger = logging.getLogger("django_anarchon")

T = TypeVar("T")

RUNNING = RunState.RUNNING.value
FINISHED = RunState.FINISHED.value
CLAIMED = RunState.CLAIMED.value
_ATTEMPT_KEY = ["job", "slot", "instance_id", "attempt", "manual"]
_RETRIES = 4
_USED_UP = "lease lapsed; attempts used up"
#: The policies the PostgreSQL functions decide; the others take the general lock path.
_FAST_POLICIES = ("skip", "allow")
#: What the general path's peek leaves to the next step: the insert, or the lock path.
_Next = Literal["insert", "lock"]


class Peek(NamedTuple):
    """The general path's lock-free read: its answer and the server's ``now``."""

    answer: ClaimOutcome | _Next
    now: int

# SQLite has one writer at a time per file. Threads of one process queue on this lock
# (woken at once) instead of sleeping in SQLite's busy handler; other processes still
# wait through the busy timeout.
# Reentrant: the peek's keep_ms/max_attempts update takes it too, also from inside the
# transaction of ``_claim_new``.
_sqlite_locks: dict[str, threading.RLock] = {}
_sqlite_locks_guard = threading.Lock()


def _sqlite_lock(name: str) -> threading.RLock:
    with _sqlite_locks_guard:
        return _sqlite_locks.setdefault(name, threading.RLock())


def _as_aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _db_datetime(ms: int) -> datetime:
    """An epoch-ms instant as the DateTimeField value Django accepts under ``USE_TZ``."""
    value = ms_to_datetime(ms)
    return value if settings.USE_TZ else value.replace(tzinfo=None)


def _delete(queryset: Any) -> int:
    """One DELETE statement, whatever signal receivers exist: these rows have no relations."""
    deleted: int = queryset._raw_delete(queryset.db)
    return deleted


def _grown(stored: int | None, claimed: int | None) -> int | None:
    """``keep_ms`` and ``max_attempts`` only grow: the larger of the stored and the claimed."""
    if claimed is None:
        return stored
    return claimed if stored is None else max(stored, claimed)


class _Row(NamedTuple):
    """What a claim that meets a run reads of it (``_peek`` and ``peek_many``)."""

    pk: int
    state: str
    token: str
    attempt: int
    lease_until: int
    keep: int | None
    attempts: int | None
    status: str | None
    slot: int
    finished: int | None


#: ``_Row``'s columns, in its order.
_ROW_COLUMNS = ("id", "state", "token", "attempt", "lease_until_ms", "keep_ms", "max_attempts",
                "status", "slot", "finished_at_ms")


def _settled(c: RunClaim, run: _Row, now: int) -> ClaimOutcome | None:
    """The answer of a claim that meets ``run`` where it is settled without a lock:
    ``done`` for a run won through ``claim()``; ``running`` for another token's live
    lease; ``done`` for a finished run still remembered that this claim may not retry
    (the instances that lose a burst of instant runs ask after the winners finished).
    ``None``: the lock path decides (a takeover, a retry, the same token, a forgotten run).
    """
    if run.state == CLAIMED:
        return ClaimOutcome.done()
    if run.state == RUNNING and run.token != c.token and run.lease_until > now:
        return ClaimOutcome.running(int(run.attempt))
    if (
        run.state == FINISHED
        and now <= forget_after_ms(
            run.slot, run.slot if run.finished is None else run.finished, run.keep
        )
        and not (run.status in ("failed", "interrupted") and run.attempt < c.max_attempts)
    ):
        return ClaimOutcome.done()
    return None


def _grows(c: RunClaim, run: _Row) -> bool:
    """Whether the claim raises the run's ``keep_ms`` or ``max_attempts`` (a write)."""
    return run.state != CLAIMED and (run.keep, run.attempts) != (
        _grown(run.keep, c.keep_ms), _grown(run.attempts, c.max_attempts)
    )


def _forget_after() -> Any:
    """``forget_after_ms(slot, finished_at, keep_ms)`` as an ORM expression on ``Run``."""
    big = BigIntegerField()
    since = Greatest(Coalesce(F("finished_at_ms"), F("slot")), F("slot"), output_field=big)
    kept = Greatest(
        Coalesce(F("keep_ms"), Value(DEFAULT_KEEP_MS, output_field=big)),
        Value(MIN_KEEP_MS, output_field=big),
        output_field=big,
    )
    return since + kept


def _transient(exc: DatabaseError) -> bool:
    """A deadlock, lock timeout, serialization failure or busy SQLite file: try again."""
    text = str(exc).lower()
    code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
    sqlstate = getattr(getattr(exc, "__cause__", None), "sqlstate", None)
    return (
        code in (1205, 1213)
        or sqlstate in ("40001", "40P01", "55P03")
        or "database is locked" in text
        or "deadlock" in text
    )


class Store:
    """The database backend's store on one alias; every method is one batch of work."""

    def __init__(self, using: str, *, fast_path: bool = True) -> None:
        self.using = using
        self.vendor: str = connections[using].vendor
        now_ms_sql(self.vendor)  # refuses an unsupported database early
        self.fast_path = fast_path and self.vendor == "postgresql"
        self._functions_checked = False
        self._latest = False
        self._batch = False
        self._write_lock: threading.RLock | None = None
        if self.vendor == "sqlite":
            self._write_lock = _sqlite_lock(str(connections[using].settings_dict["NAME"]))
        #: The ledger and pauses (``LedgerStore``); the async wrapper calls it.
        self.ledger = Ledger(self)

    # -- plumbing ----------------------------------------------------------------------

    def _runs(self) -> Any:
        return Run.objects.using(self.using)

    def _attempts(self) -> Any:
        return RunAttempt.objects.using(self.using)

    @contextlib.contextmanager
    def _write(self) -> Iterator[None]:
        """One write transaction (on SQLite, queued behind this process's other writers)."""
        if self._write_lock is None:
            with transaction.atomic(using=self.using):
                yield
        else:
            with self._write_lock, transaction.atomic(using=self.using):
                yield

    @contextlib.contextmanager
    def _single_write(self) -> Iterator[None]:
        """One autocommit write statement; on SQLite queued like ``_write``."""
        if self._write_lock is None:
            yield
        else:
            with self._write_lock:
                yield

    def _retrying(self, fn: Callable[[], T], *, also_conflicts: bool = False) -> T:
        """Run ``fn``; after a transient error or a lost connection, again (same token).

        Every caller is safe to repeat: claims carry their token, the rest are upserts or
        token-guarded updates. ``also_conflicts``: a unique violation means another
        claimer created the run meanwhile, and the next try reads it.
        """
        connection = connections[self.using]
        for attempt in range(_RETRIES):
            try:
                return fn()
            except IntegrityError:
                if not also_conflicts or attempt == _RETRIES - 1:
                    raise
            except OperationalError as exc:
                connection.close_if_unusable_or_obsolete()
                lost = connection.connection is None
                if attempt == _RETRIES - 1 or not (lost or _transient(exc)):
                    raise
                logger.debug("database backend: retrying after %s", exc)
                time.sleep(random.uniform(0.002, 0.02) * (attempt + 1))
        raise AssertionError("unreachable")  # pragma: no cover

    def now_ms(self) -> int:
        """The server's ``now`` in epoch milliseconds."""
        with connections[self.using].cursor() as cursor:
            cursor.execute(f"SELECT {now_ms_sql(self.vendor)}")
            row = cursor.fetchone()
        return int(row[0])

    def _use_functions(self) -> bool:
        if self.fast_path and not self._functions_checked:
            self._functions_checked = True
            installed, latest, batch = self._retrying(
                lambda: postgres.functions_installed(connections[self.using])
            )
            if not installed:
                logger.warning(
                    "database backend: the PostgreSQL claim functions are missing on %r "
                    "(migrations not applied?); every claim takes the general lock path",
                    self.using,
                )
                self.fast_path = False
            elif not latest:
                logger.warning(
                    "database backend: migration 0009's PostgreSQL functions are missing on "
                    "%r; claims use the v3 functions and runs end through the ORM", self.using,
                )
            elif not batch:
                logger.warning(
                    "database backend: migration 0010's PostgreSQL function is missing on "
                    "%r; batches of claims are decided one claim at a time", self.using,
                )
            self._latest = installed and latest
            self._batch = self._latest and batch
        return self.fast_path

    def _v4(self) -> bool:
        """On PostgreSQL's fast path: migration 0009's functions (claims v4, finish_many)."""
        return self._use_functions() and self._latest

    def _lock_job(self, job: str) -> int:
        """Lock the job's row until the transaction ends; return the server's ``now``.

        Claims of one job take turns here; claims of different jobs never wait on each other.
        """
        return self._lock_job_row(job).now

    def _lock_job_row(self, job: str) -> JobRow:
        """``_lock_job``, also returning the row's pause (read in the same statement)."""
        locks = JobLock.objects.using(self.using).filter(job=job)
        if self.vendor == "sqlite":
            if not locks.update(job=F("job")):
                self._create_lock(job)
        else:
            locks = locks.select_for_update()
        locked = locks.annotate(now=ServerNowMs()).values_list("now", *PAUSE_COLUMNS)
        rows = list(locked.all())
        if not rows:
            self._create_lock(job)
            rows = list(locked.all())
        now, *pause = rows[0]
        return JobRow(int(now), *pause)

    def _lock_jobs(self, jobs: list[str], *fields: str) -> tuple[int, dict[str, tuple[Any, ...]]]:
        """Lock the rows of ``jobs`` (which exist) in job order; the server's ``now`` and
        each job's ``fields``. One order for every caller: two never wait in a circle."""
        locks = JobLock.objects.using(self.using).filter(job__in=jobs)
        if self.vendor == "sqlite":
            locks.update(job=F("job"))  # takes the database's write lock first
        else:
            locks = locks.select_for_update()
        rows = list(
            locks.order_by("job").annotate(now=ServerNowMs()).values_list("job", "now", *fields)
        )
        now = max((int(row[1]) for row in rows), default=None)
        return (self.now_ms() if now is None else now), {row[0]: row[2:] for row in rows}

    def _create_lock(self, job: str) -> None:
        try:
            with transaction.atomic(using=self.using):
                JobLock.objects.using(self.using).create(job=job)
        except IntegrityError:
            pass  # another claimer created it first

    # -- Backend -----------------------------------------------------------------------

    def check(self) -> None:
        """Fail now, with the database's own error, if the tables (or a migration) are missing.

        ``max_attempts`` is read so that a database without migration 0002 fails here, not
        at the first claim.
        """
        self._retrying(lambda: self._runs().filter(job="").values_list("max_attempts").first())
        self._use_functions()

    def prepare_job(self, job: str) -> None:
        def prepare() -> None:
            if not JobLock.objects.using(self.using).filter(job=job).exists():
                with self._single_write():
                    self._create_lock(job)

        self._retrying(prepare)

    def prepare_jobs(self, jobs: list[str]) -> None:
        """Many jobs' lock rows: one read of those that exist, one INSERT of the rest."""
        self._retrying(lambda: self._ensure_locks(jobs))

    def _ensure_locks(self, jobs: list[str]) -> None:
        locks = JobLock.objects.using(self.using)
        existing = set(locks.filter(job__in=jobs).values_list("job", flat=True))
        missing = [job for job in dict.fromkeys(jobs) if job not in existing]
        if missing:
            with self._single_write():
                self._insert_locks(missing)

    def _insert_locks(self, jobs: list[str]) -> None:
        """``INSERT`` of (job, created_at) only, ignoring a row a racing start made.

        Not ``bulk_create``: it binds every column, and the nullable pause and
        fingerprint columns made SQLite split 300 rows into three statements in a
        transaction; two columns fit ~500 rows in each statement.
        """
        connection = connections[self.using]
        ops, quote = connection.ops, connection.ops.quote_name
        fields = [JobLock._meta.get_field("job"), JobLock._meta.get_field("created_at")]
        created = ops.adapt_datetimefield_value(timezone.now())
        head = (
            f"{ops.insert_statement(on_conflict=OnConflict.IGNORE)} "
            f"{quote(JobLock._meta.db_table)} ({quote('job')}, {quote('created_at')}) VALUES "
        )
        tail = ops.on_conflict_suffix_sql(fields, OnConflict.IGNORE, None, None)
        size = max(ops.bulk_batch_size(fields, jobs), 1)
        with connection.cursor() as cursor:
            for start in range(0, len(jobs), size):
                batch = jobs[start : start + size]
                cursor.execute(
                    head + ", ".join(["(%s, %s)"] * len(batch)) + f" {tail}",
                    [value for job in batch for value in (job, created)],
                )

    def claim(self, input: ClaimInput) -> bool:
        if self._use_functions():
            return self._retrying(lambda: postgres.claim(connections[self.using], input))
        return self._retrying(lambda: self._claim(input))

    def claim_many(self, inputs: list[ClaimInput]) -> list[bool]:
        return [self.claim(i) for i in inputs]

    def _holder(self, input: ClaimInput) -> str | None:
        token: str | None = (
            self._runs()
            .filter(job=input.job, slot=input.slot)
            .values_list("token", flat=True)
            .first()
        )
        return token

    def _claim(self, input: ClaimInput) -> bool:
        """The unique (job, slot) decides, in autocommit: no transaction to hold open.

        A claimer that comes after the winner committed only reads (one statement).
        """
        holder = self._holder(input)
        if holder is not None:
            return holder == input.token
        with self._single_write():
            try:
                self._runs().create(
                    job=input.job,
                    slot=input.slot,
                    attempt=1,
                    token=input.token,
                    instance_id=input.instance_id,
                    lease_until_ms=ServerNowMs(),
                    state=CLAIMED,
                    reason="scheduled",
                    started_at_ms=ServerNowMs(),
                )
            except IntegrityError:
                return self._holder(input) == input.token
            # Should this process die right here, the run is still claimed, and the
            # winner's save_result() writes the history row anyway.
            self._put_attempt(
                input.job, input.slot, input.instance_id, 1, False,
                reason="scheduled", status="running", started_at=self.now_ms(),
            )
        return True

    def record_manual_run(self, input: ClaimInput) -> int | None:
        def record() -> int:
            with self._write():
                now = self._lock_job(input.job)
                window, slot = input.slot, None
                while slot is None:  # the first slot from input.slot without a manual run
                    used = set(
                        self._attempts()
                        .filter(job=input.job, manual=True, slot__gte=window, slot__lt=window + 100)
                        .values_list("slot", flat=True)
                    )
                    slot = next((s for s in range(window, window + 100) if s not in used), None)
                    window += 100
                self._attempts().create(
                    job=input.job,
                    slot=slot,
                    scheduled_at=_db_datetime(slot),
                    instance_id=input.instance_id,
                    manual=True,
                    attempt=1,
                    reason="manual",
                    status="running",
                    started_at=_db_datetime(now),
                )
                return slot

        slot = self._retrying(record)
        return None if slot == input.slot else slot

    def save_result(
        self, job: str, result: StoredResult, history_size: int, history_ttl_ms: int | None
    ) -> None:
        def save() -> None:
            with self._write():
                self._put_result(job, result)
                self._prune(job, history_size, history_ttl_ms)

        self._retrying(save)

    def _put_result(self, job: str, result: StoredResult) -> None:
        self._put_attempt(
            job, result.slot, result.by, result.attempt, result.manual,
            reason="manual" if result.manual else result.reason,
            status=result.status,
            started_at=result.started_at,
            finished_at=result.finished_at,
            duration_ms=result.duration_ms,
            error=result.error,
            keep_reason=True,
        )

    def _prune(self, job: str, history_size: int, history_ttl_ms: int | None) -> None:
        """Set-based: the newest ``history_size`` attempts stay, none older than the ttl.

        Also forgets finished runs once ``now > max(finished_at, slot) + kept_ms(keep_ms)``
        (the lease table's own pruning; ``forget_after_ms`` in SQL).
        """
        attempts = self._attempts().filter(job=job)
        if history_size <= 0:
            _delete(attempts)
        else:
            cut = list(
                attempts.order_by("-started_at", "-slot", "-attempt", "-id").values_list(
                    "started_at", "slot", "attempt", "id"
                )[history_size : history_size + 1]
            )
            if cut:
                started, slot, attempt, pk = cut[0]
                _delete(attempts.filter(
                    Q(started_at__lt=started)
                    | Q(started_at=started, slot__lt=slot)
                    | Q(started_at=started, slot=slot, attempt__lt=attempt)
                    | Q(started_at=started, slot=slot, attempt=attempt, id__lte=pk)
                ))
        if history_ttl_ms is not None:
            oldest = _db_datetime(self.now_ms() - history_ttl_ms)
            _delete(attempts.filter(
                Q(finished_at__lt=oldest) | Q(finished_at__isnull=True, started_at__lt=oldest)
            ))
        _delete(
            self._runs()
            .alias(forget_after=_forget_after())
            .filter(job=job, state=FINISHED, forget_after__lt=ServerNowMs())
        )

    def history(self, job: str, limit: int) -> list[RunRecord]:
        if limit <= 0:
            return []

        def read() -> list[RunRecord]:
            rows = (
                self._attempts()
                .filter(job=job)
                .order_by("-started_at", "-slot", "-attempt")
                .values_list(
                    "slot", "instance_id", "manual", "attempt", "reason", "status",
                    "started_at", "finished_at", "duration_ms", "error",
                )[:limit]
            )
            return [
                RunRecord(
                    job=job,
                    slot=slot,
                    scheduled_at=ms_to_datetime(slot),
                    instance_id=instance_id,
                    manual=manual,
                    attempt=attempt,
                    reason=reason,
                    status=status,
                    started_at=_as_aware(started_at),
                    finished_at=None if finished_at is None else _as_aware(finished_at),
                    duration_ms=duration_ms,
                    error=error,
                )
                for (
                    slot, instance_id, manual, attempt, reason, status,
                    started_at, finished_at, duration_ms, error,
                ) in rows
            ]

        return self._retrying(read)

    def _put_attempt(
        self,
        job: str,
        slot: int,
        instance_id: str,
        attempt: int,
        manual: bool,
        *,
        reason: str,
        status: str,
        started_at: int,
        finished_at: int | None = None,
        duration_ms: int | None = None,
        error: str | None = None,
        keep_reason: bool = False,
    ) -> None:
        """Insert or overwrite one attempt in one statement (``keep_reason``: the claim's wins)."""
        values = {
            "job": job,
            "slot": slot,
            "scheduled_at": _db_datetime(slot),
            "instance_id": instance_id,
            "manual": manual,
            "attempt": attempt,
            "reason": reason,
            "status": status,
            "started_at": _db_datetime(started_at),
            "finished_at": None if finished_at is None else _db_datetime(finished_at),
            "duration_ms": duration_ms,
            "error": error,
        }
        update = ["status", "started_at", "finished_at", "duration_ms", "error"]
        if not keep_reason:
            update.append("reason")
        features = connections[self.using].features
        unique = _ATTEMPT_KEY if features.supports_update_conflicts_with_target else ()
        self._insert(RunAttempt, values, OnConflict.UPDATE, update, unique)

    # -- RunStore ----------------------------------------------------------------------

    def run_claim(self, c: RunClaim) -> ClaimOutcome:
        if c.mode == "new" and (c.overlap not in _FAST_POLICIES or c.reason == "backfill"):
            # buffer_*/cancel_other: one transaction under the job's lock decides it all
            # (the buffer, the cancel and its history record), on every database; and a
            # backfill, whose history must be read in the same transaction.
            return self._retrying(lambda: self._run_claim_locked(c), also_conflicts=True)
        if c.mode == "new" and self._use_functions():
            v4 = self._v4()
            outcome = self._retrying(lambda: postgres.run_claim(connections[self.using], c, v4))
            if outcome is not None:
                return outcome
            return self._retrying(lambda: self._run_claim_locked(c), also_conflicts=True)
        return self._retrying(lambda: self._run_claim_generic(c), also_conflicts=True)

    def run_claim_many(self, claims: list[RunClaim]) -> list[ClaimOutcome]:
        """On PostgreSQL, the new runs of the batch in one round trip; the rest one by one."""
        fresh = [
            c for c in claims
            if c.mode == "new" and c.overlap in _FAST_POLICIES and c.reason != "backfill"
        ]
        if len(fresh) < 2 or not self._use_functions():
            return [self.run_claim(c) for c in claims]
        v4, v5 = self._v4(), self._batch
        decided = self._retrying(
            lambda: postgres.run_claim_many(connections[self.using], fresh, v4, v5)
        )
        answers = dict(zip(map(id, fresh), decided, strict=True))
        outcomes: list[ClaimOutcome] = []
        for c in claims:
            outcome = answers.get(id(c))
            if outcome is None:
                outcome = (
                    self._retrying(
                        functools.partial(self._run_claim_locked, c), also_conflicts=True
                    )
                    if id(c) in answers
                    else self.run_claim(c)
                )
            outcomes.append(outcome)
        return outcomes

    def _run_claim_generic(self, c: RunClaim) -> ClaimOutcome:
        if c.mode == "new":
            peeked = self._peek(c)
            if isinstance(peeked.answer, ClaimOutcome):
                return peeked.answer
            if peeked.answer == "insert":
                outcome = self._claim_new(c, peeked)
                if outcome is not None:
                    return outcome
        return self._run_claim_locked(c)

    def _peek(self, c: RunClaim) -> Peek:
        """One read, no lock: ``running`` or ``done``, or for a run that does not exist
        ``early``/``late``; with the server's ``now`` of that read.

        Each answer was true when the row was read and changes nothing, so no lock is
        needed; ``running`` still raises the run's ``keep_ms``/``max_attempts`` to the
        claim's (a rare second statement: only when the job's options grew). ``late`` is
        answered here only when it writes no mark (a catch-up, or the slot's mark is there
        already); else, and for a paused job, the lock path decides and marks. The read
        also takes the job's pause and the slot's mark. ``"insert"``: the insert decides.
        It reads no other run of the job: every claimer of a slot peeks, often twice, and
        only the winner sweeps (``_claim_new``).
        """
        connection = connections[self.using]
        quote = connection.ops.quote_name
        columns = ", ".join(f"r.{quote(name)}" for name in _ROW_COLUMNS)
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {now_ms_sql(self.vendor)}, {columns}, l.{quote('paused_at_ms')}, "
                f"l.{quote('paused_until_ms')}, m.{quote('id')} "
                f"FROM (SELECT 1 AS one) d "
                f"LEFT JOIN {quote(Run._meta.db_table)} r "
                f"ON r.{quote('job')} = %s AND r.{quote('slot')} = %s "
                f"LEFT JOIN {quote(JobLock._meta.db_table)} l ON l.{quote('job')} = %s "
                f"LEFT JOIN {quote(LedgerMark._meta.db_table)} m "
                f"ON m.{quote('job')} = %s AND m.{quote('slot')} = %s",
                [c.job, c.slot, c.job, c.job, c.slot],
            )
            row = cursor.fetchone()
        now, paused, until, mark = int(row[0]), row[-3], row[-2], row[-1]
        if row[1] is None:
            if now < c.slot:
                return Peek(ClaimOutcome.early(c.slot - now), now)
            if c.reason == "backfill" or (
                c.reason in PAUSABLE_REASONS and JobRow(now, paused, until).pause(c.job)
            ):
                return Peek("lock", now)
            if c.max_late_ms is not None and now > c.slot + c.max_late_ms:
                if c.reason == "catch-up" or mark is not None:
                    return Peek(ClaimOutcome.late(now - c.slot), now)
                return Peek("lock", now)
            return Peek("insert", now)
        run = _Row(*row[1:-3])
        answer = _settled(c, run, now)
        if answer is None:
            return Peek("lock", now)
        if _grows(c, run):
            self._grow(run.pk, c)
        return Peek(answer, now)

    def peek_many(self, claims: list[RunClaim]) -> list[ClaimOutcome | None]:
        """What each claim would be answered where it would change nothing, else ``None``:
        one read of the batch's runs, no lock, no write, no wait on another's insert.

        The engine sends it for the claims that only back another instance up (a burst's
        losers): each was a claim function call (or, off PostgreSQL, the general path);
        most answer ``running`` or ``done`` here. A claim that would raise the run's
        ``keep_ms`` or ``max_attempts`` is left to the claim, which writes them.
        """
        if not claims:
            return []
        connection = connections[self.using]
        quote = connection.ops.quote_name
        jobs, slots = sorted({c.job for c in claims}), sorted({c.slot for c in claims})
        columns = ", ".join(f"r.{quote(name)}" for name in ("job", *_ROW_COLUMNS))
        with connection.cursor() as cursor:
            # job IN (...) AND slot IN (...): the (job, slot) index answers it; the pairs
            # no claim asked for (a job's other slots of the batch) are dropped below.
            cursor.execute(
                f"SELECT {now_ms_sql(self.vendor)}, {columns} "
                f"FROM {quote(Run._meta.db_table)} r "
                f"WHERE r.{quote('job')} IN ({', '.join(['%s'] * len(jobs))}) "
                f"AND r.{quote('slot')} IN ({', '.join(['%s'] * len(slots))})",
                [*jobs, *slots],
            )
            rows = cursor.fetchall()
        found = {(row[1], int(row[10])): (int(row[0]), _Row(*row[2:])) for row in rows}
        answers: list[ClaimOutcome | None] = []
        for c in claims:
            seen = found.get((c.job, c.slot))
            if seen is None:
                answers.append(None)
                continue
            now, run = seen
            answer = _settled(c, run, now)
            answers.append(None if answer is None or _grows(c, run) else answer)
        return answers

    def _grow(self, pk: int, c: RunClaim) -> None:
        """Raise a run's ``keep_ms`` and ``max_attempts`` to the claim's; never lower them.

        One conditional UPDATE: it commutes with every other write, so it needs no lock.
        """
        values: dict[str, Any] = {}
        for name, claimed in (("keep_ms", c.keep_ms), ("max_attempts", c.max_attempts)):
            if claimed is not None:
                smaller = Q(**{f"{name}__isnull": True}) | Q(**{f"{name}__lt": claimed})
                values[name] = Case(
                    When(smaller, then=Value(claimed)),
                    default=F(name),
                    output_field=BigIntegerField(),
                )
        if values:
            with self._single_write():
                self._runs().filter(pk=pk).update(**values)

    def _claim_new(self, c: RunClaim, peeked: Peek) -> ClaimOutcome | None:
        """A new run: the unique (job, slot) decides first, then overlap.

        ``peeked`` found no run, the slot due by the server's clock, the claim in time and
        the job not paused; the lease starts at its ``now`` (never later than the insert).
        The insert ignores a conflict, so claimers of one slot wait on the winner's insert
        only, and learn the outcome by peeking again. With overlap "skip", claims of
        other slots take turns on the job's lock row before looking for a live run, and
        an ``overlap`` answer writes its mark under that lock: the insert, that look and
        the history row are one transaction. With "allow" nothing else is decided, so the
        insert and the history row are a statement each (a runner that dies between them
        gets its record when the run is taken over or swept: ``_interrupt``), and then the
        winner alone reads the job's other runs for the sweep. ``None``:
        the run exists but is not live (the general lock path decides).
        """
        now = peeked.now
        if c.overlap == "skip":
            with self._write():
                if not self._insert_run(c, now):
                    return self._lost_insert(c)
                locked_now = self._lock_job(c.job)
                busy = self._sweep(c.job, c.slot, locked_now)
                if busy is not None:
                    self._runs().filter(job=c.job, slot=c.slot, token=c.token).delete()
                    self._mark_skip(c, "overlap", locked_now)
                    return ClaimOutcome.overlap(busy)
                self._put_attempt(
                    c.job, c.slot, c.instance_id, 1, False,
                    reason=c.reason, status="running", started_at=now,
                )
            return ClaimOutcome.won(1)
        with self._single_write():
            inserted = self._insert_run(c, now)
        if not inserted:
            return self._lost_insert(c)
        with self._single_write():
            self._put_attempt(
                c.job, c.slot, c.instance_id, 1, False,
                reason=c.reason, status="running", started_at=now,
            )
        try:
            self._sweep_used_up(c.job, c.slot, now)
        except DatabaseError as exc:  # housekeeping: the next claim of the job sweeps
            logger.debug("database backend: sweep of job %s failed: %s", c.job, exc)
        return ClaimOutcome.won(1)

    def _lost_insert(self, c: RunClaim) -> ClaimOutcome | None:
        """Another claimer's run is there: what it is (``None``: the lock path decides)."""
        answer = self._peek(c).answer
        return answer if isinstance(answer, ClaimOutcome) else None

    def _insert_run(self, c: RunClaim, now: int) -> bool:
        """Insert the claim's run unless (job, slot) exists; whether it was inserted."""
        values = {
            "job": c.job, "slot": c.slot, "attempt": 1, "token": c.token,
            "instance_id": c.instance_id, "lease_until_ms": now + c.lease_ms,
            "state": RUNNING, "status": None, "reason": c.reason, "manual": False,
            "started_at_ms": now, "finished_at_ms": None, "keep_ms": c.keep_ms,
            "max_attempts": c.max_attempts,
        }
        return self._insert(Run, values, OnConflict.IGNORE) == 1

    def _insert(
        self, model: type[models.Model], values: dict[str, Any], on_conflict: OnConflict,
        update: Sequence[str] = (), unique: Sequence[str] = (),
    ) -> int:
        """One row in one statement, a conflict ignored or updated; the rows it changed.

        Django's own conflict clauses (``ON CONFLICT``, ``INSERT IGNORE``, ``ON DUPLICATE
        KEY UPDATE``, ``INSERT OR IGNORE``) without ``bulk_create``'s transaction around
        a single statement: one round trip, in the caller's transaction or alone.
        """
        connection = connections[self.using]
        ops, quote = connection.ops, connection.ops.quote_name
        meta = model._meta
        fields: list[Field[Any, Any]] = [meta.get_field(name) for name in values]  # type: ignore[misc]
        suffix = ops.on_conflict_suffix_sql(fields, on_conflict, update, unique)  # columns
        sql = (
            f"{ops.insert_statement(on_conflict=on_conflict)} {quote(meta.db_table)} "
            f"({', '.join(map(quote, values))}) "  # none of these models sets db_column
            f"VALUES ({', '.join(['%s'] * len(fields))}) {suffix}"
        )
        params = [
            f.get_db_prep_save(v, connection)
            for f, v in zip(fields, values.values(), strict=True)
        ]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return int(cursor.rowcount)

    def _sweep(self, job: str, slot: int, now: int) -> int | None:
        live = self._sweep_live(job, slot, now)
        return max(live, default=None)

    def _sweep_live(self, job: str, slot: int, now: int) -> dict[int, int]:
        """End the job's lapsed runs with their attempts used up; return its live runs.

        Before a new run of ``job`` is decided: every other running run whose lease lapsed
        by ``now`` and whose attempt reached its stored ``max_attempts`` becomes finished,
        ``interrupted`` (its attempt too, unless its runner saved a result), so that a
        crashed runner nobody may take over does not stay ``running`` forever. A row with
        no ``max_attempts`` (the previous release wrote it) is left alone. The live runs
        (slot: lease end) are what overlap "skip" and the buffers refuse to run beside.
        One read finds both; lapsed runs that may still be taken over are not read.
        """
        rows = list(
            self._runs()
            .filter(job=job, state=RUNNING)
            .exclude(slot=slot)
            .filter(Q(lease_until_ms__gt=now) | self._used_up(now))
            .values_list("pk", "slot", "lease_until_ms")
        )
        self._sweep_rows([pk for pk, _, lease_until in rows if lease_until <= now], now)
        return {int(other): int(lease_until) for _, other, lease_until in rows
                if lease_until > now}

    def _sweep_used_up(self, job: str, slot: int, now: int) -> None:
        """``_sweep_live`` without the live runs (overlap "allow" runs beside them)."""
        used_up = list(
            self._runs()
            .filter(self._used_up(now), job=job, state=RUNNING)
            .exclude(slot=slot)
            .values_list("pk", flat=True)
        )
        if used_up:
            with self._write():
                self._sweep_rows(used_up, now)

    @staticmethod
    def _used_up(now: int) -> Q:
        return Q(
            lease_until_ms__lte=now, max_attempts__isnull=False, attempt__gte=F("max_attempts")
        )

    def _sweep_rows(self, candidates: list[int], now: int) -> None:
        """Finish the ``candidates`` still used up, re-read under their row locks, so that
        a heartbeat or finish that got there first keeps its run."""
        if not candidates:
            return
        swept = list(
            self._runs()
            .select_for_update()
            .filter(self._used_up(now), pk__in=candidates, state=RUNNING)
            .order_by("slot")
        )
        if swept:
            self._runs().filter(pk__in=[run.pk for run in swept]).update(
                state=FINISHED, status="interrupted", finished_at_ms=now
            )
            for run in swept:
                self._interrupt(run, now, _USED_UP)

    def _run_claim_locked(self, c: RunClaim) -> ClaimOutcome:
        with self._write():
            job = self._lock_job_row(c.job)
            return self._decide(c, job.now, job.pause(c.job) is not None)

    def _mark_skip(self, c: RunClaim, reason: str, now: int) -> None:
        """The ``skipped`` mark of a claim's answer, in its transaction, under the job's lock."""
        self.ledger.skip(
            c.job, c.slot, reason, c.instance_id, now, c.history_size, c.history_ttl_ms
        )

    def _decide(self, c: RunClaim, now: int, paused: bool) -> ClaimOutcome:
        """The lease rules, under the job's lock, with ``now`` from the server.

        ``paused``: the job's pause is in force (read with the lock). A new run of a
        paused job, or one answered ``late`` (not a catch-up) or ``overlap``, is marked
        ``skipped`` here, in the same transaction.
        """
        # Locked too: a heartbeat or a same-token renewal (which take no job lock) waits
        # for this decision, or this decision sees them.
        run: Run | None = (
            self._runs().select_for_update().filter(job=c.job, slot=c.slot).first()
        )
        if (
            run is not None
            and run.state == FINISHED
            and now > forget_after_ms(
                run.slot,
                run.slot if run.finished_at_ms is None else run.finished_at_ms,
                run.keep_ms,
            )
        ):
            run.delete()  # forgotten, as the store may once its retention has passed
            run = None
        if run is not None:
            return self._decide_existing(c, run, now)
        if c.mode == "takeover":
            return ClaimOutcome.none()
        if now < c.slot:
            return ClaimOutcome.early(c.slot - now)
        if paused and c.reason in PAUSABLE_REASONS:
            self._mark_skip(c, "paused", now)
            # A buffered slot of it waits no more (it would hold the next slot back).
            _delete(BufferedSlot.objects.using(self.using).filter(job=c.job, slot=c.slot))
            return ClaimOutcome.paused()
        if c.reason == "backfill" and self.ledger.ran(c.job, c.slot):
            return ClaimOutcome.done()
        buffer = self._buffer(c.job, now) if c.overlap in BUFFER_POLICIES else {}
        queued = c.slot in buffer
        # A buffered slot waited for its turn: that wait never makes it late.
        if not queued and c.max_late_ms is not None and now > c.slot + c.max_late_ms:
            if c.reason != "catch-up":  # nothing to catch up is not a skip
                self._mark_skip(c, "late", now)
            return ClaimOutcome.late(now - c.slot)
        live = self._sweep_live(c.job, c.slot, now)
        busy = max(live, default=None)
        cancelled: int | None = None
        if c.overlap == "skip" and busy is not None:
            self._mark_skip(c, "overlap", now)
            return ClaimOutcome.overlap(busy)
        if c.overlap in BUFFER_POLICIES:
            answer = buffer_answer(c, live, buffer, now)
            if answer is not None:
                if answer.kind == "buffered":
                    self._hold(c, now, queued)
                else:
                    self._mark_skip(c, "overlap", now)
                return answer
            if queued:  # its turn: the run starts below
                _delete(BufferedSlot.objects.using(self.using).filter(job=c.job, slot=c.slot))
        elif c.overlap == "cancel_other":
            cancelled = self._cancel_others(c, now)
        run = Run(job=c.job, slot=c.slot, keep_ms=c.keep_ms, max_attempts=c.max_attempts)
        self._start(c, run, 1, c.reason, now)
        return ClaimOutcome.won(1, cancelled=cancelled)

    def _buffer(self, job: str, now: int) -> dict[int, int]:
        """The job's buffered slots still held (under its lock); stale ones are dropped."""
        slots = BufferedSlot.objects.using(self.using).filter(job=job)
        _delete(slots.filter(hold_until_ms__lte=now))
        return dict(slots.values_list("slot", "hold_until_ms"))

    def _hold(self, c: RunClaim, now: int, queued: bool) -> None:
        """Put ``c``'s slot in the buffer, or push its hold on (a waiter asked again)."""
        until = now + buffer_hold_ms(c.lease_ms)
        slots = BufferedSlot.objects.using(self.using)
        if queued:
            slots.filter(job=c.job, slot=c.slot).update(hold_until_ms=until)
        else:
            slots.create(job=c.job, slot=c.slot, hold_until_ms=until)

    def _cancel_others(self, c: RunClaim, now: int) -> int | None:
        """Fence every other running run of the job, and record each attempt as cancelled.

        The record is written here, in the claim's transaction: the cancelled runner
        never writes over it (docs/decisions.md). Returns the newest slot cancelled.
        """
        others = list(
            self._runs()
            .select_for_update()
            .filter(job=c.job, state=RUNNING)
            .exclude(slot=c.slot)
            .order_by("slot")
        )
        if not others:
            return None
        reason = cancel_reason(c.slot, c.instance_id)
        for run in others:
            self._interrupt(run, now, reason)
        self._runs().filter(pk__in=[run.pk for run in others]).update(
            state=FINISHED, status=CANCELLED, finished_at_ms=now
        )
        return int(others[-1].slot)

    def _decide_existing(self, c: RunClaim, run: Run, now: int) -> ClaimOutcome:
        if run.state == CLAIMED:
            return ClaimOutcome.done()  # won through claim(): not a leased run
        dirty: list[str] = []
        keep, most = _grown(run.keep_ms, c.keep_ms), _grown(run.max_attempts, c.max_attempts)
        if keep != run.keep_ms:
            run.keep_ms = keep
            dirty.append("keep_ms")
        if most != run.max_attempts:
            run.max_attempts = most
            dirty.append("max_attempts")
        if run.state == RUNNING:
            if run.token == c.token:
                run.lease_until_ms = now + c.lease_ms
                run.save(using=self.using, update_fields=["lease_until_ms", *dirty])
                return ClaimOutcome.won(run.attempt)
            if run.lease_until_ms > now:
                self._save(run, dirty)
                return ClaimOutcome.running(run.attempt)
            if run.attempt < c.max_attempts:
                self._interrupt(run, now, f"lease lapsed; taken over by {c.instance_id}")
                self._start(c, run, run.attempt + 1, "takeover", now)
                return ClaimOutcome.won(run.attempt)
            self._interrupt(run, now, _USED_UP)
            run.state, run.status, run.finished_at_ms = FINISHED, "interrupted", now
            self._save(run, [*dirty, "state", "status", "finished_at_ms"])
            return ClaimOutcome.done()
        if run.status in ("failed", "interrupted") and run.attempt < c.max_attempts:
            self._start(c, run, run.attempt + 1, c.reason, now)
            return ClaimOutcome.won(run.attempt)
        self._save(run, dirty)
        return ClaimOutcome.done()

    def _save(self, run: Run, fields: list[str]) -> None:
        if fields:
            run.save(using=self.using, update_fields=fields)

    def _start(self, c: RunClaim, run: Run, attempt: int, reason: RunReason, now: int) -> None:
        """Give the run to the claimer as ``attempt`` and record that attempt as running."""
        run.attempt = attempt
        run.token = c.token
        run.instance_id = c.instance_id
        run.lease_until_ms = now + c.lease_ms
        run.state = RUNNING
        run.status = None
        run.reason = reason
        run.started_at_ms = now
        run.finished_at_ms = None  # finish() relies on it: a running run has no finish
        run.keep_ms = _grown(run.keep_ms, c.keep_ms)
        run.max_attempts = _grown(run.max_attempts, c.max_attempts)
        run.save(using=self.using)
        self._put_attempt(
            c.job, c.slot, c.instance_id, attempt, False,
            reason=reason, status="running", started_at=now,
        )

    def _interrupt(self, run: Run, now: int, error: str) -> None:
        """Record the superseded attempt as interrupted, unless its runner saved a result."""
        key = {
            "job": run.job,
            "slot": run.slot,
            "instance_id": run.instance_id,
            "attempt": run.attempt,
            "manual": False,
        }
        values = {
            "status": "interrupted",
            "finished_at": _db_datetime(now),
            "duration_ms": max(now - run.started_at_ms, 0),
            "error": error,
        }
        if self._attempts().filter(**key, status="running").update(**values):
            return
        if not self._attempts().filter(**key).exists():  # its claim was pruned meanwhile
            self._attempts().create(
                **key,
                **values,
                scheduled_at=_db_datetime(run.slot),
                reason=run.reason,
                started_at=_db_datetime(run.started_at_ms),
            )

    def heartbeat(self, job: str, slot: int, token: str, lease_ms: int) -> bool:
        def beat() -> bool:
            with self._single_write():
                return bool(
                    self._runs()
                    .filter(job=job, slot=slot, token=token, state=RUNNING)
                    .update(lease_until_ms=ServerNowMs() + Value(lease_ms, output_field=BigIntegerField()))
                )

        return self._retrying(beat)

    def finish(self, job: str, slot: int, token: str, status: FinalStatus) -> bool:
        """Running with ``token``: finished now. Finished so already: True again (repeat-safe).

        One UPDATE for both: a repeat (the first call's reply was lost) matches the finished
        row and leaves its finish time, since a running run has no ``finished_at_ms``. A run
        the store ended ``interrupted`` with this token (its lease lapsed with no attempt
        left, so nobody else could run it) takes its own runner's late word too.
        """

        def end() -> bool:
            with self._single_write():
                return self._end(job, slot, token, status)

        return self._retrying(end)

    def finish_many(self, ends: list[RunEnd]) -> list[bool]:
        """Each end's ``finish()`` and, where it acted, its record, in one transaction.

        Runs are ended in (job, slot) order, so that two instances' batches never wait on
        each other in a circle; each job's history is pruned once, after its records.
        """
        if self._v4():
            return self._retrying(
                lambda: postgres.finish_many(connections[self.using], ends)
            )
        order = sorted(range(len(ends)), key=lambda i: (ends[i].job, ends[i].slot))

        def end_all() -> list[bool]:
            answers = [False] * len(ends)
            pruned: dict[str, RunEnd] = {}
            with self._write():
                for i in order:
                    end = ends[i]
                    if self._end(end.job, end.slot, end.token, end.status):
                        answers[i] = True
                        self._put_result(end.job, end.result)
                        pruned[end.job] = end
                for job, end in pruned.items():
                    self._prune(job, end.history_size, end.history_ttl_ms)
            return answers

        return self._retrying(end_all)

    def _end(self, job: str, slot: int, token: str, status: FinalStatus) -> bool:
        return bool(
            self._runs()
            .filter(Q(state=RUNNING) | Q(state=FINISHED, status__in=[status, "interrupted"]),
                    job=job, slot=slot, token=token)
            .update(
                finished_at_ms=Coalesce(F("finished_at_ms"), ServerNowMs()),
                state=FINISHED,
                status=status,
            )
        )

    # -- for work that commits with a run's finish (enqueue/run.py) ---------------------

    def transaction(self) -> contextlib.AbstractContextManager[None]:
        """A write transaction on this alias, queued like the store's own (SQLite)."""
        return self._write()

    def lock_running(self, job: str, slot: int, token: str) -> bool:
        """Inside ``transaction()``: lock the run if it is running with ``token``.

        Once locked, no claim can take the run over until the transaction ends, so work
        done in it and ``finish_locked()`` commit, or roll back, together.
        """
        return bool(
            list(
                self._runs()
                .select_for_update()
                .filter(job=job, slot=slot, token=token, state=RUNNING)
                .values_list("pk", flat=True)[:1]
            )
        )

    def finish_locked(self, job: str, slot: int, token: str, status: FinalStatus) -> bool:
        """Inside ``transaction()``, after ``lock_running()``: ``finish()`` in that transaction.

        The runner's own finish afterwards is a repeat, answered True (repeat-safe).
        """
        return self._end(job, slot, token, status)

    def release(self, job: str, slot: int, token: str) -> bool:
        def let_go() -> bool:
            with self._single_write():
                return bool(
                    self._runs()
                    .filter(job=job, slot=slot, token=token, state=RUNNING)
                    .update(lease_until_ms=ServerNowMs() - Value(1, output_field=BigIntegerField()))
                )

        return self._retrying(let_go)

    def active(self, job: str) -> list[ActiveRun]:
        def read() -> list[ActiveRun]:
            rows = (
                self._runs()
                .filter(job=job, state=RUNNING)
                .annotate(now=ServerNowMs())
                .order_by("slot")
                .values_list("slot", "attempt", "lease_until_ms", "now")
            )
            return [
                ActiveRun(slot=slot, attempt=attempt, alive=lease_until > now)
                for slot, attempt, lease_until, now in rows
            ]

        return self._retrying(read)

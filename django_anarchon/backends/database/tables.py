"""The database backend's plumbing: transactions, retries, the server's clock, the jobs'
lock rows, and single-statement inserts, shared by the claim paths and the store.

Everything here runs in the backend's connection threads, never on an event loop.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from django.conf import settings
from django.db import (
    DatabaseError,
    IntegrityError,
    OperationalError,
    connections,
    models,
    transaction,
)
from django.db.models import BigIntegerField, F, Field, Value
from django.db.models.constants import OnConflict
from django.db.models.functions import Coalesce, Collate, Greatest
from django.utils import timezone

from ...models import JobLock, Run, RunAttempt, RunState
from ..base import (
    DEFAULT_KEEP_MS,
    MIN_KEEP_MS,
    ms_to_datetime,
)
from . import postgres
from .clock import ServerNowMs, now_ms_sql
from .ledger import PAUSE_COLUMNS, JobRow, Ledger

__all__ = ["Tables"]

logger = logging.getLogger("django_anarchon")

T = TypeVar("T")

RUNNING = RunState.RUNNING.value
FINISHED = RunState.FINISHED.value
CLAIMED = RunState.CLAIMED.value
_ATTEMPT_KEY = ["job", "slot", "instance_id", "attempt", "manual"]
_RETRIES = 4

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



class Tables:
    """One database alias's connection work; every method runs in a connection thread."""

    def __init__(self, using: str, *, fast_path: bool = True) -> None:
        self.using = using
        self.vendor: str = connections[using].vendor
        now_ms_sql(self.vendor)  # refuses an unsupported database early
        self.fast_path = fast_path and self.vendor == "postgresql"
        self._functions_checked = False
        self._functions_lock = threading.Lock()
        #: ``postgres.functions_level``: the newest migration whose functions are there.
        self._level = 0
        self._write_lock: threading.RLock | None = None
        if self.vendor == "sqlite":
            self._write_lock = _sqlite_lock(str(connections[using].settings_dict["NAME"]))
        #: The ledger and pauses (``LedgerStore``); the async wrapper calls it.
        self.ledger = Ledger(self)

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
        """Whether claims take PostgreSQL's functions; the first call asks which are there.

        Every connection thread waits for that answer: a claim sent meanwhile went through
        the oldest functions (level 0 read as "before 0009"), which write a run before
        they lock its job, and met this release's claims in a deadlock.
        """
        if self.fast_path and not self._functions_checked:
            with self._functions_lock:
                if not self._functions_checked:
                    self._check_functions()
        return self.fast_path

    def _check_functions(self) -> None:
        self._level = self._retrying(lambda: postgres.functions_level(connections[self.using]))
        missing = {
            0: "the PostgreSQL claim functions are missing on %r (migrations not "
               "applied?); every claim takes the general lock path",
            8: "migration 0009's PostgreSQL functions are missing on %r; claims use the "
               "v3 functions and runs end through the ORM",
            9: "migration 0010's PostgreSQL function is missing on %r; batches of "
               "claims are decided one claim at a time",
            10: "migration 0011's PostgreSQL functions are missing on %r; claims write "
                "a run before they take its job's lock, and may wait on the lock path "
                "until PostgreSQL's deadlock check ends the wait",
            11: "migration 0012's PostgreSQL function is missing on %r; a single claim "
                "goes as a batch of one",
        }.get(self._level)
        if missing is not None:
            logger.warning("database backend: " + missing, self.using)
        self.fast_path = self._level > 0
        self._functions_checked = True

    def _v4(self) -> bool:
        """On PostgreSQL's fast path: migration 0009's functions (claims v4, finish_many)."""
        return self._use_functions() and self._level >= 9

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
        each job's ``fields``. One order for every caller: two never wait in a circle.

        On PostgreSQL that order is the code points' (``COLLATE "C"``), whatever the
        database's collation: the claim function locks a batch's jobs in the order the
        backend sorted them in Python.
        """
        locks = JobLock.objects.using(self.using).filter(job__in=jobs)
        if self.vendor == "sqlite":
            locks.update(job=F("job"))  # takes the database's write lock first
        else:
            locks = locks.select_for_update()
        order = Collate("job", "C") if self.vendor == "postgresql" else F("job")
        rows = list(
            locks.order_by(order).annotate(now=ServerNowMs()).values_list("job", "now", *fields)
        )
        now = max((int(row[1]) for row in rows), default=None)
        return (self.now_ms() if now is None else now), {row[0]: row[2:] for row in rows}

    def _create_lock(self, job: str) -> None:
        try:
            with transaction.atomic(using=self.using):
                JobLock.objects.using(self.using).create(job=job)
        except IntegrityError:
            pass  # another claimer created it first

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

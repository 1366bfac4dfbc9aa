"""The ledger and pauses (``LedgerStore``) in the database: marks, pause columns, since.

Marks are rows of ``LedgerMark``; a job's pause, its schedule fingerprint and since when
it has had it are nullable columns of its ``JobLock`` row. Every write of a mark happens
under the job's lock row (``Tables._lock_job``), so that the test "no mark of the job
reaches into these slots" and the insert are one step against every other writer: the
claims of the job, ``mark_skipped`` and ``mark_missed``. Times are the server's clock.

The claim rules that use these (paused, backfill ``done``, the skip marks) live in
``locked.py``, in the claim's own transaction; this module holds the SQL they share.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.models import CharField, F, Q, Value
from django.db.models.expressions import Case, When

from ...exceptions import ConfigurationError
from ...models import JobLock, LedgerMark, RunAttempt
from ..base import PauseState, SlotMark
from . import postgres
from .clock import ServerNowMs

if TYPE_CHECKING:
    from .tables import Tables

__all__ = ["JobRow", "Ledger"]

#: The widths of the columns that hold what a caller passes (models.py).
_BY_MAX = LedgerMark._meta.get_field("instance_id").max_length or 255
_REASON_MAX = LedgerMark._meta.get_field("reason").max_length or 16
_PAUSED_BY_MAX = JobLock._meta.get_field("paused_by").max_length or 150
#: Most jobs one ``pauses()`` query names (SQLite builds may allow only 999 parameters).
_CHUNK = 500
_FINGERPRINT_MAX = JobLock._meta.get_field("schedule_fingerprint").max_length or 64
#: The pause columns of a ``JobLock`` row, in ``JobRow`` order.
PAUSE_COLUMNS = ("paused_at_ms", "paused_until_ms", "paused_by", "pause_note")


@dataclass(frozen=True)
class JobRow:
    """The job's lock row as a locked read returned it, with the server's ``now``."""

    now: int
    paused_at: int | None = None
    until: int | None = None
    by: str | None = None
    note: str | None = None

    def pause(self, job: str) -> PauseState | None:
        """The pause in force at ``now`` (an ``until`` that has come ends it)."""
        if self.paused_at is None or (self.until is not None and self.until <= self.now):
            return None
        return PauseState(
            job=job, note=self.note or "", by=self.by or "", at=self.paused_at, until=self.until
        )


def _too_long(job: str, option: str, value: str, most: int) -> None:
    if len(value) > most:
        raise ConfigurationError(
            f"at most {most} characters fit in the database", job=job, option=option, value=value
        )


class Ledger:
    """The ledger operations of one store (its alias, locks and retries)."""

    def __init__(self, store: Tables) -> None:
        self.store = store
        self.using = store.using

    def _marks(self) -> Any:
        return LedgerMark.objects.using(self.using)

    # -- under the job's lock (a claim's transaction, or the methods below) -------------

    def write(
        self, job: str, slot: int, last: int, count: int, fate: str, reason: str, by: str,
        now: int,
    ) -> bool:
        """Insert a mark unless one of the job's reaches into ``slot..last``: one statement.

        Called with the job's row locked, so no other writer's mark can appear between
        the test and the insert.
        """
        connection = connections[self.using]
        quote = connection.ops.quote_name
        table = quote(LedgerMark._meta.db_table)
        columns = ", ".join(
            quote(name) for name in (
                "job", "slot", "last_slot", "count", "fate", "reason", "at_ms", "instance_id"
            )
        )
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {table} ({columns}) "
                "SELECT %s, %s, %s, %s, %s, %s, %s, %s FROM (SELECT 1 AS one) d "
                f"WHERE NOT EXISTS (SELECT 1 FROM {table} m WHERE m.{quote('job')} = %s "
                f"AND m.{quote('slot')} <= %s AND m.{quote('last_slot')} >= %s)",
                [job, slot, last, count, fate, reason, now, by, job, last, slot],
            )
            return bool(cursor.rowcount)

    def prune(self, job: str, now: int, history_size: int, history_ttl_ms: int | None) -> None:
        """The newest ``history_size`` marks by slot stay, none whose last slot is older
        than ``now - history_ttl_ms``: one read of the cut, one ``DELETE``."""
        from .tables import _delete

        marks = self._marks().filter(job=job)
        if history_size <= 0:
            _delete(marks)
            return
        drop = Q()
        cut = list(
            marks.order_by("-slot").values_list("slot", flat=True)[
                history_size : history_size + 1
            ]
        )
        if cut:
            drop |= Q(slot__lte=cut[0])
        if history_ttl_ms is not None:
            drop |= Q(last_slot__lt=now - history_ttl_ms)
        if drop:
            _delete(marks.filter(drop))

    def skip(
        self, job: str, slot: int, reason: str, by: str, now: int,
        history_size: int, history_ttl_ms: int | None,
    ) -> bool:
        """A ``skipped`` mark of one slot (and the pruning it triggers), under the lock."""
        written = self.write(job, slot, slot, 1, "skipped", reason, by, now)
        if written:
            self.prune(job, now, history_size, history_ttl_ms)
        return written

    def ran(self, job: str, slot: int) -> bool:
        """Whether history holds an attempt of the slot that is not a manual run."""
        return bool(
            RunAttempt.objects.using(self.using)
            .filter(job=job, slot=slot, manual=False)
            .exists()
        )

    # -- LedgerStore -------------------------------------------------------------------

    def marks(self, job: str, since: int | None, until: int | None, limit: int) -> list[SlotMark]:
        if limit <= 0:
            return []

        def read() -> list[SlotMark]:
            marks = self._marks().filter(job=job)
            if since is not None:
                marks = marks.filter(last_slot__gte=since)
            if until is not None:
                marks = marks.filter(slot__lte=until)
            rows = marks.order_by("-slot").values_list(
                "slot", "fate", "reason", "at_ms", "instance_id", "last_slot", "count"
            )[:limit]
            return [
                SlotMark(slot=slot, fate=fate, reason=reason, at=at, by=by, last=last, count=n)
                for slot, fate, reason, at, by, last, n in rows
            ]

        return self.store._retrying(read)

    def mark_skipped(
        self, job: str, slot: int, reason: str, instance_id: str,
        history_size: int, history_ttl_ms: int | None,
    ) -> bool:
        _too_long(job, "reason", reason, _REASON_MAX)
        _too_long(job, "instance_id", instance_id, _BY_MAX)

        def mark() -> bool:
            with self.store._write():
                now = self.store._lock_job(job)
                return self.skip(job, slot, reason, instance_id, now, history_size, history_ttl_ms)

        return self.store._retrying(mark)

    def mark_missed(
        self, job: str, ranges: Sequence[tuple[int, int, int]], instance_id: str,
        history_size: int, history_ttl_ms: int | None,
    ) -> int:
        """Every range in one transaction under the job's lock; one pruning at the end."""
        _too_long(job, "instance_id", instance_id, _BY_MAX)
        if not ranges:
            return 0

        def mark() -> int:
            with self.store._write():
                now = self.store._lock_job(job)
                written = sum(
                    self.write(job, slot, last, count, "missed", "missed", instance_id, now)
                    for slot, last, count in ranges
                )
                if written:
                    self.prune(job, now, history_size, history_ttl_ms)
                return written

        return self.store._retrying(mark)

    def pause(self, job: str, note: str, by: str, until: int | None) -> PauseState:
        _too_long(job, "by", by, _PAUSED_BY_MAX)

        def pause() -> PauseState:
            with self.store._write():
                now = self.store._lock_job(job)
                JobLock.objects.using(self.using).filter(job=job).update(
                    paused_at_ms=now, paused_until_ms=until, paused_by=by, pause_note=note
                )
            return PauseState(job=job, note=note, by=by, at=now, until=until)

        return self.store._retrying(pause)

    def resume(self, job: str) -> PauseState | None:
        """Clears every pause column; the pause that was in force, by the server's clock."""

        def resume() -> PauseState | None:
            with self.store._write():
                row = self.store._lock_job_row(job)
                if row.paused_at is not None:
                    JobLock.objects.using(self.using).filter(job=job).update(
                        **dict.fromkeys(PAUSE_COLUMNS)
                    )
                return row.pause(job)

        return self.store._retrying(resume)

    def pauses(self, jobs: Sequence[str]) -> dict[str, PauseState]:
        """One query per 500 of ``jobs`` (SQLite's bound on parameters): the rows paused
        with no ``until`` or one to come."""
        names = list(dict.fromkeys(jobs))
        found: dict[str, PauseState] = {}
        for start in range(0, len(names), _CHUNK):
            chunk = names[start : start + _CHUNK]

            def read(chunk: list[str] = chunk) -> dict[str, PauseState]:
                rows = (
                    JobLock.objects.using(self.using)
                    .filter(job__in=chunk, paused_at_ms__isnull=False)
                    .filter(
                        Q(paused_until_ms__isnull=True) | Q(paused_until_ms__gt=ServerNowMs())
                    )
                    .values_list("job", *PAUSE_COLUMNS)
                )
                return {
                    job: PauseState(job=job, note=note or "", by=by or "", at=at, until=until)
                    for job, at, until, by, note in rows
                }

            found.update(self.store._retrying(read))
        return found

    def job_since(self, jobs: Sequence[tuple[str, str]]) -> list[int]:
        """A read without locks answers the jobs the store knows with these fingerprints
        (every job, after the first start of a deploy). The rest take one transaction: their
        rows locked in job order, one ``UPDATE`` of the new or changed fingerprints
        (``known_since_ms`` = the server's now), the answers.

        The read matters: claims lock the same rows, and every instance asks at start, so a
        locking read of a thousand jobs held a burst's claims up to a second.
        A job named twice takes its last fingerprint (both answers are its instant).
        """
        for job, fingerprint in jobs:
            _too_long(job, "schedule fingerprint", fingerprint, _FINGERPRINT_MAX)
        wanted = dict(jobs)
        if not wanted:
            return []

        def known() -> dict[str, int]:
            rows = JobLock.objects.using(self.using).filter(job__in=list(wanted)).values_list(
                "job", "schedule_fingerprint", "known_since_ms"
            )
            return {
                job: int(since) for job, fingerprint, since in rows
                if since is not None and fingerprint == wanted[job]
            }

        answers = self.store._retrying(known)
        rest = {job: fp for job, fp in wanted.items() if job not in answers}
        if rest:
            answers.update(self.store._retrying(lambda: self._record_since(rest)))
        return [answers[job] for job, _ in jobs]

    def _record_since(self, wanted: dict[str, str]) -> dict[str, int]:
        """``job_since``'s locking step, for the jobs its read did not answer."""
        with self.store._write():
            self.store._ensure_locks(list(wanted))
            now, stored = self.store._lock_jobs(
                list(wanted), "schedule_fingerprint", "known_since_ms"
            )
            changed = [
                job for job, fingerprint in wanted.items()
                if stored[job][0] != fingerprint or stored[job][1] is None
            ]
            if changed and self.store.vendor == "postgresql":
                connection = connections[self.using]
                postgres.set_fingerprints(
                    connection, connection.ops.quote_name(JobLock._meta.db_table),
                    {job: wanted[job] for job in changed}, now,
                )
            elif changed:
                JobLock.objects.using(self.using).filter(job__in=changed).update(
                    schedule_fingerprint=Case(
                        *(When(job=job, then=Value(wanted[job])) for job in changed),
                        default=F("schedule_fingerprint"),
                        output_field=CharField(),
                    ),
                    known_since_ms=now,
                )
            return {job: now if job in changed else int(stored[job][1]) for job in wanted}
